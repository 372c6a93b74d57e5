// T5's span-corruption samples of a config's split, in the order training
// reads them: the split's GPT samples (zoo/gpt_samples.h) of the raw length
// whose corrupted inputs fit the encoder's length, each corrupted with spans
// drawn from the run's seed and the sample's place in the run (the same on
// every rank and layout; new spans when the data wraps into another epoch).
// tessel-train's T5 task trains on them; `tessel-dataset samples` prints
// them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zoo/config.pb.h"
#include "zoo/gpt_samples.h"
#include "zoo/t5_span_corruption.h"

namespace tessel::zoo {

// The span corruption of a resolved config: data.noise_density,
// mean_noise_span_length, eos_token_id and model.vocab_size.
SpanCorruptionOptions SpanCorruptionOptionsOf(const config::Config& c);

class T5Samples {
 public:
  // inputs_length: the encoder's length at most (model.max_seq_length).
  // Throws naming the values when a corpus id or eos is among the
  // sentinels (the vocabulary's last ids) the spans need.
  T5Samples(const std::vector<std::unique_ptr<Corpus>>& corpora, const std::vector<double>& weights,
            int split, const SpanCorruptionOptions& options, int64_t inputs_length, int64_t num_samples,
            uint64_t seed, const std::string& name);
  // Sample i of the run (wrapping at the split's samples, with new spans).
  SpanCorrupted Sample(int64_t i) const;
  int64_t raw_length() const { return raw_; }
  const SpanCorruptedLengths& lengths() const { return lengths_; }
  const SpanCorruptionOptions& options() const { return options_; }
  std::string Summary(const std::vector<std::unique_ptr<Corpus>>& corpora, int split) const {
    return samples_->Summary(corpora, split);
  }

 private:
  SpanCorruptionOptions options_;
  int64_t raw_;
  SpanCorruptedLengths lengths_;
  uint64_t seed_;
  std::unique_ptr<GPTSamples> samples_;
};

}  // namespace tessel::zoo
