#include "zoo/t5_samples.h"

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

std::vector<std::unique_ptr<Corpus>> BundledCorpus() {
  std::vector<std::unique_ptr<Corpus>> corpora;
  corpora.push_back(std::make_unique<Corpus>(
      std::string(TESSEL_SOURCE_DIR) + "/data/tiny_corpus/tiny_corpus_text_document", "95,5,0"));
  return corpora;
}

// Puts the hidden spans back into the inputs (without eos): the raw tokens.
std::vector<int64_t> Restored(const SpanCorrupted& c, int64_t lowest_sentinel) {
  std::vector<int64_t> out;
  for (size_t i = 0; i + 1 < c.inputs.size(); ++i) {
    if (c.inputs[i] < lowest_sentinel) {
      out.push_back(c.inputs[i]);
      continue;
    }
    size_t j = 0;
    while (c.targets[j] != c.inputs[i]) ++j;
    for (++j; j + 1 < c.targets.size() && c.targets[j] < lowest_sentinel; ++j) out.push_back(c.targets[j]);
  }
  return out;
}

TEST(T5Samples, TheGptSamplesOfTheRawLengthCorruptedBySampleIndex) {
  const auto corpora = BundledCorpus();
  const SpanCorruptionOptions options{.vocab_size = 2176, .eos_id = 0};
  const T5Samples t5(corpora, {1.0}, 0, options, 64, 100, 1234, "train");
  const GPTSamples raw(corpora, {1.0}, 0, 69, 100, 1234, "train");
  EXPECT_EQ(t5.raw_length(), 70);
  EXPECT_EQ(t5.lengths().inputs, 64);
  EXPECT_EQ(t5.lengths().targets, 16);
  const int64_t lowest_sentinel = 2176 - t5.lengths().spans;
  for (int64_t i : {int64_t{0}, int64_t{7}, raw.size() + 7}) {
    std::vector<int64_t> tokens;
    raw.Sample(i % raw.size(), &tokens);
    const SpanCorrupted c = t5.Sample(i);
    EXPECT_EQ(static_cast<int64_t>(c.inputs.size()), 64);
    EXPECT_EQ(Restored(c, lowest_sentinel), tokens) << "sample " << i;
  }
  EXPECT_EQ(t5.Sample(7).inputs, t5.Sample(7).inputs);
  // The next epoch reads the same tokens behind other spans.
  EXPECT_NE(t5.Sample(7).inputs, t5.Sample(raw.size() + 7).inputs);
}

TEST(T5Samples, NoRoomForTheSentinelsIsNamed) {
  const auto corpora = BundledCorpus();
  std::string e = testing::ErrorOf(
      [&] { T5Samples(corpora, {1.0}, 0, {.vocab_size = 2050, .eos_id = 0}, 64, 10, 1, "train"); });
  EXPECT_NE(e.find("holds token id 2047 but the 4 sentinels of a 70-token sequence are ids 2046 .. 2049"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("expected model.vocab_size of at least 2052"), std::string::npos) << e;
  e = testing::ErrorOf(
      [&] { T5Samples(corpora, {1.0}, 0, {.vocab_size = 2176, .eos_id = 2175}, 64, 10, 1, "train"); });
  EXPECT_NE(e.find("data.eos_token_id 2175 is among the 4 sentinel ids"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessel::zoo
