// T5's pre-training objective, span corruption (Raffel et al. 2020, as
// Hugging Face's run_t5_mlm_flax.py implements it): a sequence of tokens
// loses noise_density of them in spans of mean_span_length on average;
// the encoder reads the rest with one sentinel in place of each span, the
// decoder predicts each sentinel followed by the tokens it hid. Sentinels
// are the vocabulary's last ids (the first span's is vocab_size - 1, the
// next one below, as T5's extra_id_0, extra_id_1, ...); both sequences end
// with eos_id. The span count and lengths depend only on the sequence
// length, so every sample of one length gives inputs and targets of the
// same lengths (no padding); where the spans fall depends on the seed.
#pragma once

#include <cstdint>
#include <vector>

namespace tessel::zoo {

struct SpanCorruptionOptions {
  double noise_density = 0.15;
  double mean_span_length = 3.0;
  int64_t vocab_size = 0;  // the sentinels are its last ids
  int64_t eos_id = 1;
};

struct SpanCorrupted {
  std::vector<int64_t> inputs;   // kept tokens, a sentinel per span, eos
  std::vector<int64_t> targets;  // per span: its sentinel and its tokens; eos
};

// The encoder and decoder lengths span corruption gives `length` tokens.
struct SpanCorruptedLengths {
  int64_t noise_tokens, spans, inputs, targets;
};
// Throws naming the values unless 0 < noise_density < 1, mean_span_length
// >= 1, length >= 2 and the spans have kept tokens between them.
SpanCorruptedLengths SpanCorruptionLengths(int64_t length, const SpanCorruptionOptions& options);

// The most raw tokens whose corrupted inputs (with eos) are at most
// `inputs_length` long (Hugging Face's 568 for 512 at the defaults).
int64_t SpanCorruptionRawLength(int64_t inputs_length, const SpanCorruptionOptions& options);

// Corrupts `tokens` with spans drawn from `seed` (a 64-bit Mersenne twister:
// the same spans on every rank and platform). Throws if a token is itself
// a sentinel id or the spans need more sentinels than the vocabulary has.
SpanCorrupted CorruptSpans(const std::vector<int64_t>& tokens, const SpanCorruptionOptions& options,
                           uint64_t seed);

}  // namespace tessel::zoo
