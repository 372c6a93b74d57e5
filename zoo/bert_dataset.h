// BERT pre-training samples from an indexed dataset of sentences (one
// sequence per sentence, documents marked in the index: what
// tools/preprocess_data.py --split-sentences writes), cut the way Megatron-LM
// cuts them:
//
// - Pairing: each document's sentences are walked in order and grouped into
//   chunks of at least two sentences that reach a target length (the room
//   left by [CLS] A [SEP] B [SEP]; with probability short_seq_prob a
//   shorter, random one). Documents of one sentence give nothing. The chunks
//   of every epoch are then shuffled together. Documents holding a sentence
//   longer than max(512, seq_length) tokens are skipped, as Megatron skips
//   them (their "sentences" are not sentences).
// - Sample i (its own generator, seeded by the seed and i alone, so any rank
//   builds it the same whatever the layout): its chunk is cut at a random
//   sentence into segments A and B, swapped with probability 1/2 (the
//   sentence-order label: 1 when swapped), trimmed one token at a time from
//   the longer segment's front or back until both fit, framed as
//   [CLS] A [SEP] B [SEP] with token types 0 for [CLS] A [SEP] and 1 for
//   B [SEP], then masked: round(masked_lm_prob x tokens) positions (at least
//   one; never [CLS] or [SEP]) are predicted; each becomes [MASK] with
//   probability 0.8, a random id below vocab_size with 0.1, or stays. The
//   rest is padding ([PAD], type 0, attention mask 0, label -100).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zoo/gpt_dataset.h"
#include "zoo/indexed_dataset.h"

namespace tessel::zoo {

struct BertSampleOptions {
  int64_t seq_length = 128;  // tokens of a sample, padding included
  int64_t vocab_size = 0;    // random replacements are drawn below it
  double masked_lm_prob = 0.15;
  double short_seq_prob = 0.1;
  int64_t cls_id = 101, sep_id = 102, mask_id = 103, pad_id = 0;
};

struct BertSample {
  std::vector<int64_t> ids;             // seq_length
  std::vector<int64_t> token_types;     // 0 / 1
  std::vector<uint8_t> attention_mask;  // 1 for a token, 0 for padding
  std::vector<int64_t> mlm_labels;      // the original id where predicted, else -100
  int64_t sentence_label = 0;           // 1: the segments were swapped
  int64_t predictions = 0;              // positions whose label is not -100
};

class BertDataset {
 public:
  // At least `num_samples` samples from the documents in `range` (as many
  // epochs over them as that takes). `name` ("train", "validation") names
  // the split in errors. Throws when the options are out of range or when
  // no document of the split has two sentences.
  BertDataset(const IndexedDataset& data, DocumentRange range, const BertSampleOptions& options,
              int64_t num_samples, uint64_t seed, std::string name);

  int64_t size() const { return static_cast<int64_t>(chunks_.size()); }
  int epochs() const { return epochs_; }
  // Documents of the split with at least two sentences (the others give no sample).
  int64_t usable_documents() const { return usable_documents_; }
  BertSample Sample(int64_t i) const;
  // Sample i's predicted positions (its `predictions`), from the index
  // alone: what a loss normalised over a whole batch needs of every row.
  int64_t Predictions(int64_t i) const;

 private:
  // Tokens [begin, end) of sentences [first, end) read as one sequence.
  struct Segment {
    int64_t first_sentence, end_sentence;
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
  };
  void ReadSegment(const Segment& segment, std::vector<int64_t>* out) const;
  struct Chunk {
    int64_t first_sentence, end_sentence;  // sentences [first, end) of one document
    int64_t target_tokens;                 // what A and B are trimmed to
  };
  const IndexedDataset& data_;
  BertSampleOptions options_;
  uint64_t seed_;
  int epochs_ = 0;
  int64_t usable_documents_ = 0;
  std::vector<Chunk> chunks_;
};

}  // namespace tessel::zoo
