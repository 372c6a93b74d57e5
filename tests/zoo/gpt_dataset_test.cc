#include "zoo/gpt_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

using testing::ErrorOf;

TEST(GPTDatasetTest, SplitsDocumentsByProportion) {
  auto r = SplitDocuments("98,2,0", 100);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, 98u);
  EXPECT_EQ(r[1].begin, 98u);
  EXPECT_EQ(r[1].end, 100u);
  EXPECT_EQ(r[2].size(), 0u);
  r = SplitDocuments("1", 7);
  EXPECT_EQ(r[0].size(), 7u);
  EXPECT_EQ(r[1].size() + r[2].size(), 0u);
  r = SplitDocuments("949,50,1", 1000);
  EXPECT_EQ(r[0].size(), 949u);
  EXPECT_EQ(r[1].size(), 50u);
  EXPECT_EQ(r[2].size(), 1u);
  for (const char* bad : {"a,b", "-1,2", "0,0,0", "1,2,3,4", ""})
    EXPECT_NE(ErrorOf([&] { SplitDocuments(bad, 10); }).find("data.split '" + std::string(bad) + "'"),
              std::string::npos)
        << bad;
}

// Documents of 5, 7, 3 and 9 tokens whose ids are their stream positions
// plus 1000·document, so a sample shows where it came from.
std::string MakeDataset() {
  // One file per process: CTest runs these tests in parallel processes, and
  // one rewriting the file another has mapped would change its samples.
  const std::string prefix =
      (std::filesystem::temp_directory_path() / ("tessel_gpt_dataset_test_" + std::to_string(::getpid())))
          .string();
  IndexedDatasetWriter writer(prefix, TokenDType::kInt32);
  int64_t doc = 0;
  for (int64_t length : {5, 7, 3, 9}) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < length; ++t) tokens.push_back(1000 * doc + t);
    writer.AddDocument(tokens);
    ++doc;
  }
  writer.Finish();
  return prefix;
}

TEST(GPTDatasetTest, SamplesCoverTheStreamOfEachEpoch) {
  IndexedDataset data(MakeDataset());
  const int64_t s = 4;
  GPTDataset ds(data, {0, 4}, s, 10, 7, "train");
  // 24 tokens per epoch: (e·24 - 1) / 4 samples must reach 10 -> 2 epochs, 11 samples.
  EXPECT_EQ(ds.epochs(), 2);
  EXPECT_EQ(ds.size(), 11);
  std::multiset<int64_t> seen;
  std::set<std::vector<int64_t>> distinct;
  for (int64_t i = 0; i < ds.size(); ++i) {
    std::vector<int64_t> t;
    ds.Sample(i, &t);
    ASSERT_EQ(t.size(), static_cast<size_t>(s + 1));
    // Within a document, tokens run consecutively; a new document starts at 0.
    for (size_t j = 1; j < t.size(); ++j)
      EXPECT_TRUE(t[j] == t[j - 1] + 1 || t[j] % 1000 == 0) << "sample " << i << " token " << j;
    for (size_t j = 0; j < t.size() - 1; ++j) seen.insert(t[j]);  // inputs: each stream token once
    distinct.insert(t);
  }
  EXPECT_EQ(distinct.size(), 11u);
  // 11 samples x 4 inputs = 44 of the 48 stream tokens; each token id occurs
  // at most once per epoch (twice in all).
  EXPECT_EQ(seen.size(), 44u);
  for (int64_t id : seen) EXPECT_LE(seen.count(id), 2u) << id;
}

TEST(GPTDatasetTest, TheSeedFixesTheOrder) {
  IndexedDataset data(MakeDataset());
  GPTDataset a(data, {0, 4}, 3, 6, 1, "train"), b(data, {0, 4}, 3, 6, 1, "train"),
      c(data, {0, 4}, 3, 6, 2, "train");
  std::vector<int64_t> ta, tb, tc;
  for (int64_t i = 0; i < a.size(); ++i) {
    a.Sample(i, &ta);
    b.Sample(i, &tb);
    c.Sample(i, &tc);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(GPTDatasetTest, ASplitTooSmallIsNamed) {
  IndexedDataset data(MakeDataset());
  const std::string e = ErrorOf([&] { GPTDataset ds(data, {2, 3}, 8, 1, 1, "validation"); });
  EXPECT_NE(e.find("validation split, documents 2 to 3): 3 tokens; a sample needs 9"), std::string::npos)
      << e;
}

// More samples than an index in memory can list (1e9 iterations of a
// batch, say) are refused before it is built, naming what to lower; they
// allocated until bad_alloc before, and a count past 2^62 overflowed.
TEST(GPTDatasetTest, AnIndexTooLargeIsRefusedBeforeItIsBuilt) {
  IndexedDataset data(MakeDataset());
  for (const int64_t samples : {int64_t{1} << 40, int64_t{4'000'000'000'000'000'000}}) {
    const std::string e = ErrorOf([&] { GPTDataset ds(data, {0, 4}, 3, samples, 1, "train"); });
    EXPECT_NE(e.find("GPT dataset"), std::string::npos) << e;
    EXPECT_NE(e.find("(train split): " + std::to_string(samples) + " samples of 3 tokens need"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("train.train_iter"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace tessel::zoo
