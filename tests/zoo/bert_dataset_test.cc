#include "zoo/bert_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

using testing::ErrorOf;

std::filesystem::path TempDir() {
  const auto dir =
      std::filesystem::temp_directory_path() / ("tessel_bert_dataset_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// Token 10000 + 1000·d + 100·s + j is token j of sentence s of document d, so
// a sample's tokens tell where they came from; 0..200 are free for the
// special tokens and random replacements. Document d has d % 5 + 1
// sentences of 3 + (d + s) % 9 tokens.
constexpr int64_t kVocab = 20000;
int64_t DocumentOf(int64_t token) { return (token - 10000) / 1000; }
int64_t SentenceOf(int64_t token) { return (token - 10000) % 1000 / 100; }

std::string WriteSentences(const std::string& name, int documents) {
  const std::string prefix = (TempDir() / name).string();
  IndexedDatasetWriter w(prefix, TokenDType::kInt32);
  for (int64_t d = 0; d < documents; ++d) {
    std::vector<std::vector<int64_t>> sentences;
    for (int64_t s = 0; s < d % 5 + 1; ++s) {
      sentences.emplace_back();
      for (int64_t j = 0; j < 3 + (d + s) % 9; ++j)
        sentences.back().push_back(10000 + 1000 * d + 100 * s + j);
    }
    w.AddSentences(sentences);
  }
  w.Finish();
  return prefix;
}

BertSampleOptions Options(int64_t seq) {
  return {.seq_length = seq, .vocab_size = kVocab, .cls_id = 101, .sep_id = 102, .mask_id = 103, .pad_id = 0};
}

TEST(BertDatasetTest, SamplesAreFramedPairedAndMasked) {
  IndexedDataset data(WriteSentences("framed", 10));
  EXPECT_EQ(data.num_documents(), 10u);
  EXPECT_EQ(data.document_end(1) - data.document_begin(1), 2);
  const int64_t seq = 24;
  BertDataset ds(data, {0, 10}, Options(seq), 300, 7, "train");
  EXPECT_EQ(ds.usable_documents(), 8);  // documents 0 and 5 have one sentence
  ASSERT_GE(ds.size(), 300);
  int64_t swapped = 0, predicted = 0, masked = 0, kept = 0, real = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    SCOPED_TRACE(i);
    const BertSample s = ds.Sample(i);
    ASSERT_EQ(s.ids.size(), static_cast<size_t>(seq));
    ASSERT_EQ(s.token_types.size(), s.ids.size());
    ASSERT_EQ(s.attention_mask.size(), s.ids.size());
    ASSERT_EQ(s.mlm_labels.size(), s.ids.size());
    // [CLS] A [SEP] B [SEP], then padding.
    EXPECT_EQ(s.ids[0], 101);
    std::vector<size_t> seps;
    size_t length = 0;
    for (size_t p = 0; p < s.ids.size(); ++p) {
      if (s.attention_mask[p]) length = p + 1;
      if (s.ids[p] == 102 && s.mlm_labels[p] == -100) seps.push_back(p);
    }
    ASSERT_EQ(seps.size(), 2u);
    EXPECT_EQ(seps[1] + 1, length);
    EXPECT_GE(seps[0], 2u);           // A has a token
    EXPECT_GE(seps[1], seps[0] + 2);  // so has B
    for (size_t p = 0; p < s.ids.size(); ++p) {
      EXPECT_EQ(s.attention_mask[p], p < length ? 1 : 0);
      EXPECT_EQ(s.token_types[p], p > seps[0] && p < length ? 1 : 0);
      if (p >= length) {
        EXPECT_EQ(s.ids[p], 0);
        EXPECT_EQ(s.mlm_labels[p], -100);
      }
    }
    // Each segment's original tokens: one document, A's sentences before
    // B's unless swapped (label 1), in order within a segment.
    std::vector<int64_t> a_sentences, b_sentences;
    std::set<int64_t> documents;
    int64_t predictions = 0;
    for (size_t p = 1; p < length; ++p) {
      if (p == seps[0] || p == seps[1]) continue;
      const int64_t original = s.mlm_labels[p] == -100 ? s.ids[p] : s.mlm_labels[p];
      ASSERT_GE(original, 10000);
      documents.insert(DocumentOf(original));
      (p < seps[0] ? a_sentences : b_sentences).push_back(SentenceOf(original));
      if (s.mlm_labels[p] != -100) {
        ++predictions;
        masked += s.ids[p] == 103;
        kept += s.ids[p] == s.mlm_labels[p];
      }
    }
    EXPECT_EQ(documents.size(), 1u);
    EXPECT_TRUE(std::is_sorted(a_sentences.begin(), a_sentences.end()));
    EXPECT_TRUE(std::is_sorted(b_sentences.begin(), b_sentences.end()));
    if (s.sentence_label == 0)
      EXPECT_LT(a_sentences.back(), b_sentences.front());
    else
      EXPECT_GT(a_sentences.front(), b_sentences.back());
    EXPECT_EQ(predictions, s.predictions);
    EXPECT_EQ(ds.Predictions(i), s.predictions);
    EXPECT_EQ(s.predictions,
              std::min<int64_t>(length - 3, std::max<int64_t>(1, std::llround(0.15 * length))));
    swapped += s.sentence_label;
    predicted += predictions;
    real += static_cast<int64_t>(length);
  }
  // Half the pairs swapped; of the predicted positions 80% masked and 10% kept.
  const double n = static_cast<double>(ds.size()), p = static_cast<double>(predicted);
  EXPECT_NEAR(static_cast<double>(swapped) / n, 0.5, 0.08);
  EXPECT_NEAR(static_cast<double>(masked) / p, 0.8, 0.06);
  EXPECT_NEAR(static_cast<double>(kept) / p, 0.1, 0.05);
  EXPECT_NEAR(p / static_cast<double>(real), 0.15, 0.03);
}

TEST(BertDatasetTest, SamplesDependOnTheSeedAndIndexOnly) {
  IndexedDataset data(WriteSentences("seeded", 30));
  BertDataset a(data, {0, 30}, Options(32), 50, 11, "train");
  BertDataset b(data, {0, 30}, Options(32), 50, 11, "train");
  BertDataset other(data, {0, 30}, Options(32), 50, 12, "train");
  ASSERT_EQ(a.size(), b.size());
  int differ = 0;
  // Any order of reading gives the same samples.
  for (int64_t i = a.size() - 1; i >= 0; --i) {
    EXPECT_EQ(a.Sample(i).ids, b.Sample(i).ids);
    EXPECT_EQ(a.Sample(i).mlm_labels, b.Sample(i).mlm_labels);
  }
  for (int64_t i = 0; i < std::min(a.size(), other.size()); ++i)
    differ += a.Sample(i).ids != other.Sample(i).ids;
  EXPECT_GT(differ, a.size() / 2);
}

TEST(BertDatasetTest, LongSentencesAreTrimmedAndShortSamplesDrawn) {
  IndexedDataset data(WriteSentences("trimmed", 40));
  // Room for 8 - 3 = 5 tokens of A and B: every chunk is trimmed.
  BertDataset tight(data, {0, 40}, Options(8), 100, 3, "train");
  for (int64_t i = 0; i < tight.size(); ++i) {
    const BertSample s = tight.Sample(i);
    int64_t length = 0;
    for (uint8_t m : s.attention_mask) length += m;
    EXPECT_LE(length, 8);
  }
  // short_seq_prob 1: targets below the room, so many samples are shorter.
  BertSampleOptions shorter = Options(64);
  shorter.short_seq_prob = 1.0;
  BertSampleOptions full = Options(64);
  full.short_seq_prob = 0.0;
  auto mean_length = [&](const BertSampleOptions& o) {
    BertDataset ds(data, {0, 40}, o, 200, 5, "train");
    double total = 0;
    for (int64_t i = 0; i < ds.size(); ++i)
      for (uint8_t m : ds.Sample(i).attention_mask) total += m;
    return total / static_cast<double>(ds.size());
  };
  EXPECT_LT(mean_length(shorter), mean_length(full) - 2);
}

TEST(BertDatasetTest, DocumentsWithOverlongSentencesAreSkipped) {
  // Documents 0 and 2: two short sentences; document 1: a sentence of 600
  // tokens (over max(512, seq_length)), as a text not split into sentences.
  const std::string prefix = (TempDir() / "overlong").string();
  IndexedDatasetWriter w(prefix, TokenDType::kInt32);
  w.AddSentences({{10001, 10002, 10003}, {10101, 10102}});
  w.AddSentences({std::vector<int64_t>(600, 11000), {11101, 11102}});
  w.AddSentences({{12001, 12002}, {12101, 12102, 12103}});
  w.Finish();
  IndexedDataset data(prefix);
  BertDataset ds(data, {0, 3}, Options(64), 20, 1, "train");
  EXPECT_EQ(ds.usable_documents(), 2);
  for (int64_t i = 0; i < ds.size(); ++i)
    for (int64_t id : ds.Sample(i).mlm_labels) EXPECT_TRUE(id == -100 || id < 11000 || id >= 12000) << id;
  BertDataset wide(data, {0, 3}, Options(600), 20, 1, "train");  // 600 fits a 600-token sample
  EXPECT_EQ(wide.usable_documents(), 3);
  const std::string e = ErrorOf([&] { BertDataset(data, {1, 2}, Options(64), 20, 1, "validation"); });
  EXPECT_NE(e.find("no document has two sentences of at most 512 tokens (1 hold a longer one)"),
            std::string::npos)
      << e;
}

TEST(BertDatasetTest, BadDataAndOptionsAreNamed) {
  // One sentence per document: nothing to pair.
  const std::string prefix = (TempDir() / "single").string();
  IndexedDatasetWriter w(prefix, TokenDType::kUInt16);
  for (int d = 0; d < 5; ++d) w.AddDocument(std::vector<int64_t>{5, 6, 7});
  w.Finish();
  IndexedDataset single(prefix);
  std::string e = ErrorOf([&] { BertDataset(single, {0, 5}, Options(16), 10, 1, "train"); });
  EXPECT_NE(e.find("no document has two sentences"), std::string::npos) << e;
  EXPECT_NE(e.find("--split-sentences"), std::string::npos) << e;
  IndexedDataset data(WriteSentences("options", 10));
  e = ErrorOf([&] { BertDataset(data, {0, 10}, Options(4), 10, 1, "train"); });
  EXPECT_NE(e.find("a sample of 4 tokens; expected at least 5"), std::string::npos) << e;
  BertSampleOptions o = Options(16);
  o.masked_lm_prob = 1.5;
  e = ErrorOf([&] { BertDataset(data, {0, 10}, o, 10, 1, "validation"); });
  EXPECT_NE(e.find("(validation): masked_lm_prob 1.5"), std::string::npos) << e;
  e = ErrorOf([&] { BertDataset(data, {0, 11}, Options(16), 10, 1, "train"); });
  EXPECT_NE(e.find("documents [0, 11) of 10"), std::string::npos) << e;
  BertDataset ds(data, {0, 10}, Options(16), 10, 1, "train");
  e = ErrorOf([&] { ds.Sample(ds.size()); });
  EXPECT_NE(e.find("sample " + std::to_string(ds.size()) + " of"), std::string::npos) << e;
}

TEST(BertDatasetTest, TheBundledSentencesMakeSamples) {
  IndexedDataset data(std::string(TESSEL_SOURCE_DIR) + "/data/tiny_corpus/tiny_corpus_bert_sentence");
  EXPECT_EQ(data.num_documents(), 687u);
  EXPECT_GT(data.num_sequences(), data.num_documents());
  EXPECT_LT(data.MaxToken(), 2048);
  BertDataset ds(data, SplitDocuments("90,10,0", data.num_documents())[0], Options(64), 1000, 1234, "train");
  EXPECT_GT(ds.usable_documents(), 300);
  const BertSample s = ds.Sample(0);
  EXPECT_EQ(s.ids[0], 101);
  for (int64_t id : s.ids) EXPECT_LT(id, 2048);
}

}  // namespace
}  // namespace tessel::zoo
