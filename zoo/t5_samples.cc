#include "zoo/t5_samples.h"

#include "core/error.h"

namespace tessel::zoo {

SpanCorruptionOptions SpanCorruptionOptionsOf(const config::Config& c) {
  return {.noise_density = c.data().noise_density(),
          .mean_span_length = c.data().mean_noise_span_length(),
          .vocab_size = c.model().vocab_size(),
          .eos_id = c.data().eos_token_id()};
}

T5Samples::T5Samples(const std::vector<std::unique_ptr<Corpus>>& corpora, const std::vector<double>& weights,
                     int split, const SpanCorruptionOptions& options, int64_t inputs_length,
                     int64_t num_samples, uint64_t seed, const std::string& name)
    : options_(options),
      raw_(SpanCorruptionRawLength(inputs_length, options)),
      lengths_(SpanCorruptionLengths(raw_, options)),
      seed_(seed) {
  // The sentinels are the vocabulary's last ids: every ordinary id, eos
  // included, must lie below them.
  const int64_t lowest_sentinel = options.vocab_size - lengths_.spans;
  TESSEL_CHECK(options.eos_id < lowest_sentinel)
      << "T5 samples: data.eos_token_id " << options.eos_id << " is among the " << lengths_.spans
      << " sentinel ids (" << lowest_sentinel << " .. " << options.vocab_size - 1 << ") span corruption of a "
      << raw_ << "-token sequence needs; expected model.vocab_size of at least "
      << options.eos_id + 1 + lengths_.spans;
  for (const auto& corpus : corpora) {
    const int64_t max_token = corpus->data.MaxToken();
    TESSEL_CHECK(max_token < lowest_sentinel)
        << "T5 samples: dataset " << corpus->data.prefix() << " holds token id " << max_token << " but the "
        << lengths_.spans << " sentinels of a " << raw_ << "-token sequence are ids " << lowest_sentinel
        << " .. " << options.vocab_size - 1
        << " (the vocabulary's last); expected model.vocab_size of at least "
        << max_token + 1 + lengths_.spans;
  }
  // GPTSamples gives seq + 1 tokens per sample: raw_ of them.
  samples_ = std::make_unique<GPTSamples>(corpora, weights, split, raw_ - 1, num_samples, seed, name);
}

SpanCorrupted T5Samples::Sample(int64_t i) const {
  std::vector<int64_t> tokens;
  samples_->Sample(i % samples_->size(), &tokens);
  return CorruptSpans(tokens, options_, seed_ * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i));
}

}  // namespace tessel::zoo
