#include "zoo/indexed_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

using testing::ErrorOf;

std::filesystem::path TempDir() {
  auto dir =
      std::filesystem::temp_directory_path() / ("tessel_indexed_dataset_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// An .idx image by hand: the header and arrays as given.
std::string Index(uint8_t code, const std::vector<int32_t>& lengths, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& documents, uint64_t version = 1) {
  std::string s("MMIDIDX\0\0", 9);
  Put(&s, version);
  Put(&s, code);
  Put(&s, static_cast<uint64_t>(lengths.size()));
  Put(&s, static_cast<uint64_t>(documents.size()));
  for (int32_t l : lengths) Put(&s, l);
  for (int64_t o : offsets) Put(&s, o);
  for (int64_t d : documents) Put(&s, d);
  return s;
}

std::string ParseError(const std::string& idx, uint64_t bin_bytes) {
  return ErrorOf(
      [&] { ParseIndex(reinterpret_cast<const uint8_t*>(idx.data()), idx.size(), bin_bytes, "t.idx"); });
}

TEST(IndexedDatasetTest, EveryIntegerDTypeRoundTrips) {
  const std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {}, {100, 0, 7, 9}, {5}};
  for (TokenDType dtype : {TokenDType::kUInt8, TokenDType::kInt8, TokenDType::kInt16, TokenDType::kUInt16,
                           TokenDType::kInt32, TokenDType::kInt64}) {
    const std::string prefix = (TempDir() / ("rt" + std::to_string(static_cast<int>(dtype)))).string();
    IndexedDatasetWriter writer(prefix, dtype);
    for (const auto& d : docs) writer.AddDocument(d);
    writer.Finish();
    EXPECT_EQ(std::filesystem::file_size(prefix + ".bin"), 8 * TokenBytes(dtype));
    EXPECT_EQ(std::filesystem::file_size(prefix + ".idx"), 34u + 12 * 4 + 8 * 5);
    IndexedDataset data(prefix);
    EXPECT_EQ(data.dtype(), dtype);
    ASSERT_EQ(data.num_sequences(), 4u);
    ASSERT_EQ(data.num_documents(), 4u);
    for (size_t k = 0; k < docs.size(); ++k) {
      EXPECT_EQ(data.document_begin(k), static_cast<int64_t>(k));
      EXPECT_EQ(data.document_end(k), static_cast<int64_t>(k + 1));
      std::vector<int64_t> tokens;
      data.Read(k, 0, data.sequence_length(k), &tokens);
      EXPECT_EQ(tokens, docs[k]) << "dtype " << static_cast<int>(dtype) << " doc " << k;
    }
    std::vector<int64_t> middle;
    data.Read(2, 1, 2, &middle);
    EXPECT_EQ(middle, (std::vector<int64_t>{0, 7}));
    EXPECT_EQ(data.MaxToken(), 100);
    const std::string e = ErrorOf([&] { data.Read(2, 3, 2, &middle); });
    EXPECT_NE(e.find("tokens [3, 5) of sequence 2 are out of range"), std::string::npos) << e;
  }
}

TEST(IndexedDatasetTest, TokensThatDoNotFitAreRefused) {
  IndexedDatasetWriter writer((TempDir() / "fit").string(), TokenDType::kUInt16);
  const std::vector<int64_t> bad = {3, 70000};
  const std::string e = ErrorOf([&] { writer.AddDocument(bad); });
  EXPECT_NE(e.find("token 70000 does not fit dtype code 8"), std::string::npos) << e;
  IndexedDatasetWriter negative((TempDir() / "neg").string(), TokenDType::kUInt8);
  const std::vector<int64_t> minus = {-1};
  EXPECT_NE(ErrorOf([&] { negative.AddDocument(minus); }).find("token -1 does not fit"), std::string::npos);
}

TEST(IndexedDatasetTest, MultiSequenceDocumentsRead) {
  const std::string idx = Index(8, {2, 1, 3}, {0, 4, 6}, {0, 2, 3});
  const std::string bin("\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00\x06\x00", 12);
  const std::string prefix = (TempDir() / "multi").string();
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  IndexedDataset data(prefix);
  EXPECT_EQ(data.num_sequences(), 2u + 0 + 1);
  EXPECT_EQ(data.num_documents(), 2u);
  EXPECT_EQ(data.document_begin(0), 0);
  EXPECT_EQ(data.document_end(0), 2);
  EXPECT_EQ(data.document_end(1), 3);
  std::vector<int64_t> t;
  data.Read(2, 0, 3, &t);
  EXPECT_EQ(t, (std::vector<int64_t>{4, 5, 6}));
}

TEST(IndexedDatasetTest, BadIndexesAreNamed) {
  const std::string good = Index(4, {2, 3}, {0, 8}, {0, 1, 2});
  EXPECT_EQ(ParseError(good, 20), "");
  for (size_t cut : {0ul, 5ul, 33ul, 34ul, 41ul, good.size() - 1}) {
    const std::string e = ParseError(good.substr(0, cut), 20);
    EXPECT_NE(e.find("t.idx"), std::string::npos) << cut;
    EXPECT_NE(e.find("truncated"), std::string::npos) << "cut at " << cut << ": " << e;
  }
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(ParseError(magic, 20).find("does not start with MMIDIDX"), std::string::npos);
  EXPECT_NE(ParseError(Index(4, {2, 3}, {0, 8}, {0, 1, 2}, 2), 20).find("version 2; expected version 1"),
            std::string::npos);
  for (uint8_t code : {0, 6, 7, 9})
    EXPECT_NE(
        ParseError(Index(code, {2, 3}, {0, 8}, {0, 1, 2}), 20).find("dtype code " + std::to_string(code)),
        std::string::npos)
        << static_cast<int>(code);
  EXPECT_NE(ParseError(Index(4, {2, 3}, {0, 8}, {0, 1, 2}), 19)
                .find("sequence 1 (3 tokens at byte 8) does not lie within the 19-byte .bin"),
            std::string::npos);
  EXPECT_NE(ParseError(Index(4, {2, -3}, {0, 8}, {0, 1, 2}), 20).find("sequence 1 has length -3"),
            std::string::npos);
  EXPECT_NE(ParseError(Index(4, {2, 3}, {0, 9}, {0, 1, 2}), 40).find("does not lie within"),
            std::string::npos);
  EXPECT_NE(ParseError(Index(4, {2, 3}, {0, 8}, {1, 1, 2}), 20).find("document indices run from 1 to 2"),
            std::string::npos);
  EXPECT_NE(ParseError(Index(4, {2, 3}, {0, 8}, {0, 1, 1}), 20).find("expected 0 to the sequence count 2"),
            std::string::npos);
  EXPECT_NE(
      ParseError(Index(4, {2, 3, 1}, {0, 8, 20}, {0, 2, 1, 3}), 24).find("document index 2 (1) is below"),
      std::string::npos);
  EXPECT_NE(ParseError(good + "x", 20).find("take exactly"), std::string::npos);
  // Counts too large for the file do not allocate or overflow.
  std::string huge = good;
  const uint64_t n = ~0ull / 4;
  std::memcpy(huge.data() + 18, &n, 8);
  EXPECT_NE(ParseError(huge, 20).find("truncated"), std::string::npos);
}

TEST(IndexedDatasetTest, MissingFilesAreNamed) {
  const std::string prefix = (TempDir() / "nothing").string();
  const std::string e = ErrorOf([&] { IndexedDataset data(prefix); });
  EXPECT_NE(e.find("cannot open " + prefix + ".idx"), std::string::npos) << e;
}

TEST(IndexedDatasetTest, TheBundledCorpusOpens) {
  IndexedDataset data(std::string(TESSEL_SOURCE_DIR) + "/data/tiny_corpus/tiny_corpus_text_document");
  EXPECT_EQ(data.dtype(), TokenDType::kUInt16);
  EXPECT_EQ(data.num_sequences(), 687u);
  EXPECT_EQ(data.num_documents(), 687u);
  int64_t tokens = 0;
  for (size_t i = 0; i < data.num_sequences(); ++i) tokens += data.sequence_length(i);
  EXPECT_EQ(tokens, 53688);
  EXPECT_EQ(data.MaxToken(), 2047);
  std::vector<int64_t> last;
  data.Read(0, data.sequence_length(0) - 1, 1, &last);
  EXPECT_EQ(last, std::vector<int64_t>{0});  // every document ends with <|endoftext|>
}

}  // namespace
}  // namespace tessel::zoo
