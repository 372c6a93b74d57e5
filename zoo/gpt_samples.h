// The samples a GPT config's split gives, in the order training reads
// them: its indexed dataset (or the blend of several, data.blend) cut into
// train / validation / test documents by data.split, each split's samples
// shuffled with the run's seed. tessel-train reads batches from it;
// `tessel-dataset samples` prints them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zoo/blended_dataset.h"
#include "zoo/config.pb.h"
#include "zoo/gpt_dataset.h"
#include "zoo/indexed_dataset.h"

namespace tessel::zoo {

// An indexed dataset and its documents' train / validation / test ranges.
struct Corpus {
  Corpus(const std::string& prefix, const std::string& split)
      : data(prefix), splits(SplitDocuments(split, data.num_documents())) {}
  IndexedDataset data;
  std::vector<DocumentRange> splits;
};

// The corpora of a resolved config's data: data_prefix's, or each of
// data.blend's with its weight in `weights`.
std::vector<std::unique_ptr<Corpus>> OpenCorpora(const config::DataConfig& data, std::vector<double>* weights);

// The samples of one split: the one corpus's, or the blend's corpora's in
// the proportions of their weights (each corpus's own samples in its own
// order, drawn as zoo::Blend says). Training's samples are split 0 with
// the config's seed, validation's split 1 with seed + 1 (GPTTask).
class GPTSamples {
 public:
  GPTSamples(const std::vector<std::unique_ptr<Corpus>>& corpora, const std::vector<double>& weights, int split,
             int64_t seq, int64_t num_samples, uint64_t seed, const std::string& name);
  int64_t size() const;
  // The seq + 1 tokens of sample i (wrapping at size()), appended to out.
  void Sample(int64_t i, std::vector<int64_t>* out) const;
  // "2399 samples (3 epochs of 653 documents)", or a blend's parts.
  std::string Summary(const std::vector<std::unique_ptr<Corpus>>& corpora, int split) const;

 private:
  std::vector<std::unique_ptr<GPTDataset>> parts_;
  std::unique_ptr<Blend> blend_;
};

}  // namespace tessel::zoo
