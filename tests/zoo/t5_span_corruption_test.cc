#include "zoo/t5_span_corruption.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

// Puts the hidden spans back: each input sentinel replaced by the target
// tokens after the same sentinel.
std::vector<int64_t> Reassemble(const SpanCorrupted& c, int64_t vocab, int64_t spans) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < c.inputs.size(); ++i) {
    const int64_t t = c.inputs[i];
    if (t < vocab - spans) {
      out.push_back(t);
      continue;
    }
    size_t j = 0;
    while (c.targets[j] != t) ++j;
    for (++j; j + 1 < c.targets.size() && c.targets[j] < vocab - spans; ++j) out.push_back(c.targets[j]);
  }
  return out;
}

TEST(SpanCorruption, HidesSpansBehindSentinelsThatTheTargetsRestore) {
  const SpanCorruptionOptions options{.vocab_size = 1000, .eos_id = 1};
  std::vector<int64_t> tokens(114);
  std::iota(tokens.begin(), tokens.end(), 100);
  // The lengths of Hugging Face's T5 pre-training script: 568 raw tokens
  // make its 512-token encoder input and 114-token target (85 noise tokens
  // in 28 spans).
  const SpanCorruptedLengths t5 = SpanCorruptionLengths(568, options);
  EXPECT_EQ(t5.noise_tokens, 85);
  EXPECT_EQ(t5.spans, 28);
  EXPECT_EQ(t5.inputs, 512);
  EXPECT_EQ(t5.targets, 114);
  EXPECT_EQ(SpanCorruptionRawLength(512, options), 568);  // compute_input_and_target_lengths(512)
  for (int64_t inputs : {3, 10, 64, 100, 511}) {
    const int64_t raw = SpanCorruptionRawLength(inputs, options);
    EXPECT_LE(SpanCorruptionLengths(raw, options).inputs, inputs);
    EXPECT_GT(SpanCorruptionLengths(raw + 1, options).inputs, inputs) << inputs;
  }
  const SpanCorruptedLengths l = SpanCorruptionLengths(114, options);
  EXPECT_EQ(l.noise_tokens, 17);
  EXPECT_EQ(l.spans, 6);
  for (uint64_t seed : {1, 2, 3}) {
    const SpanCorrupted c = CorruptSpans(tokens, options, seed);
    EXPECT_EQ(static_cast<int64_t>(c.inputs.size()), l.inputs);
    EXPECT_EQ(static_cast<int64_t>(c.targets.size()), l.targets);
    EXPECT_EQ(c.inputs.back(), 1);
    EXPECT_EQ(c.targets.back(), 1);
    EXPECT_EQ(c.targets.front(), 999);  // the first span's sentinel (extra_id_0)
    EXPECT_EQ(Reassemble(c, 1000, l.spans), tokens) << "seed " << seed;
  }
  EXPECT_EQ(CorruptSpans(tokens, options, 7).inputs, CorruptSpans(tokens, options, 7).inputs);
  EXPECT_NE(CorruptSpans(tokens, options, 7).inputs, CorruptSpans(tokens, options, 8).inputs);
}

TEST(SpanCorruption, TokensAmongTheSentinelsAndBadOptionsAreNamed) {
  const SpanCorruptionOptions options{.vocab_size = 120, .eos_id = 1};
  std::vector<int64_t> tokens(40, 5);
  tokens[3] = 118;
  std::string e = testing::ErrorOf([&] { CorruptSpans(tokens, options, 1); });
  EXPECT_NE(e.find("token 118 is outside the vocabulary below its sentinels"), std::string::npos) << e;
  e = testing::ErrorOf([&] { SpanCorruptionLengths(40, {.noise_density = 1.5}); });
  EXPECT_NE(e.find("noise_density 1.5"), std::string::npos) << e;
  // 90% noise in spans of 1 leaves too few kept tokens between the spans.
  e = testing::ErrorOf([&] { SpanCorruptionLengths(40, {.noise_density = 0.9, .mean_span_length = 1}); });
  EXPECT_NE(e.find("give 36 spans but only 4 kept tokens"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessel::zoo
