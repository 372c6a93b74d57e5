// GPT training samples from an indexed dataset, the way Megatron-LM cuts
// them: the documents are split into train / validation / test ranges by
// proportion; a split's sequences, shuffled anew each epoch, are read as one
// stream of tokens; sample j is tokens [j·s, j·s + s] of that stream (s + 1
// tokens: s inputs and, shifted by one, s labels; consecutive samples share
// one token); the samples are then shuffled. Both shuffles are seeded, so
// every rank builds the same indices and reads only the samples it needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zoo/indexed_dataset.h"

namespace tessel::zoo {

struct DocumentRange {
  size_t begin = 0, end = 0;  // documents [begin, end)
  size_t size() const { return end - begin; }
};

// "98,2,0" (proportions of train, validation and test, any scale) applied
// to `num_documents`: three consecutive ranges covering them all. Throws
// naming `split` unless it is 1 to 3 non-negative numbers with a positive sum.
std::vector<DocumentRange> SplitDocuments(const std::string& split, size_t num_documents);

// MemAvailable from /proc/meminfo (the physical memory where it is not
// given): what a dataset's index may take half of.
int64_t AvailableMemoryBytes();

class GPTDataset {
 public:
  // At least `num_samples` samples of seq_length + 1 tokens from the
  // documents in `range` (as many epochs over them as that takes). `name`
  // ("train", "validation") names the split in errors.
  GPTDataset(const IndexedDataset& data, DocumentRange range, int64_t seq_length, int64_t num_samples,
             uint64_t seed, std::string name);

  int64_t size() const { return static_cast<int64_t>(shuffle_.size()); }
  int64_t seq_length() const { return seq_length_; }
  int epochs() const { return epochs_; }
  // Appends the seq_length + 1 tokens of sample i (0 <= i < size()).
  void Sample(int64_t i, std::vector<int64_t>* out) const;

 private:
  const IndexedDataset& data_;
  int64_t seq_length_;
  int epochs_ = 0;
  std::vector<int64_t> sequences_;  // the sequence ids of every epoch, shuffled per epoch, in stream order
  std::vector<int64_t> starts_;     // the stream position where each of them begins (and the stream's end)
  std::vector<int64_t> shuffle_;    // sample order
};

}  // namespace tessel::zoo
