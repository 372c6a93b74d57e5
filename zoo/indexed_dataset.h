// Indexed datasets in Megatron-LM's memory-mapped format ("MMIDIDX",
// version 1): token ids of many sequences in <prefix>.bin, their lengths,
// byte offsets and document boundaries in <prefix>.idx. Files written here
// are read by Megatron's reader and the reverse.
//
// The .idx layout (little-endian):
//   "MMIDIDX\0\0" (9 bytes), version u64 = 1, dtype code u8,
//   sequence count N u64, document-index count D u64,
//   sequence lengths i32[N] (tokens), sequence byte offsets i64[N] into .bin,
//   document indices i64[D]: document k holds sequences [doc[k], doc[k+1]),
//   doc[0] = 0, doc[D-1] = N.
// Dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
// 7 float32, 8 uint16 (token files use an integer one).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessel::zoo {

enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};
size_t TokenBytes(TokenDType dtype);
// The smallest dtype Megatron's preprocessing picks for a vocabulary:
// uint16 below 65,500 tokens, int32 above.
TokenDType TokenDTypeForVocab(int64_t vocab_size);

// The parsed .idx: what it says, checked against itself and against the
// size of the .bin it describes. The arrays stay in the buffer parsed (they
// are not aligned there: the header is 34 bytes), read one entry at a time.
struct IndexedDatasetIndex {
  TokenDType dtype = TokenDType::kUInt16;
  size_t num_sequences = 0, num_document_indices = 0;
  const uint8_t* lengths_at = nullptr;    // i32[num_sequences]
  const uint8_t* offsets_at = nullptr;    // i64[num_sequences]
  const uint8_t* documents_at = nullptr;  // i64[num_document_indices]

  int32_t length(size_t i) const;
  int64_t offset(size_t i) const;
  int64_t document_index(size_t k) const;
};
// Parses an .idx image of `size` bytes; `bin_bytes` is the .bin's size.
// Throws naming `name`, the field and the expected value for anything out
// of place: wrong magic or version, a float or unknown dtype, counts the
// file is too short for (truncated) or longer than, negative lengths,
// sequences past the end of the .bin, document indices out of order. The
// arrays are read in place, so `data` must outlive the result.
IndexedDatasetIndex ParseIndex(const uint8_t* data, size_t size, uint64_t bin_bytes, const std::string& name);

// A dataset opened read-only: both files memory-mapped, nothing read until
// asked for.
class IndexedDataset {
 public:
  // Opens <prefix>.idx and <prefix>.bin; throws naming the missing or bad file.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return index_.dtype; }
  size_t num_sequences() const { return index_.num_sequences; }
  size_t num_documents() const { return index_.num_document_indices - 1; }
  int64_t sequence_length(size_t i) const { return index_.length(i); }
  // Sequences [first, last) of document k.
  int64_t document_begin(size_t k) const { return index_.document_index(k); }
  int64_t document_end(size_t k) const { return index_.document_index(k + 1); }
  // Appends tokens [offset, offset + count) of sequence i to `out`.
  void Read(size_t i, int64_t offset, int64_t count, std::vector<int64_t>* out) const;
  // The largest token id in the .bin (reads it all once; cached).
  int64_t MaxToken() const;

 private:
  struct Mapping;
  std::string prefix_;
  std::unique_ptr<Mapping> idx_, bin_;
  IndexedDatasetIndex index_;
  mutable int64_t max_token_ = -1;
};

// Writes <prefix>.bin and <prefix>.idx; each AddDocument is one sequence
// and one document (as Megatron's preprocessing writes text documents),
// each AddSentences one document of one sequence per sentence (as it writes
// them with --split-sentences, for BERT).
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype);
  // Throws naming the token if it does not fit the dtype.
  void AddDocument(std::span<const int64_t> tokens);
  void AddSentences(const std::vector<std::vector<int64_t>>& sentences);
  // Writes the index; the files are complete after this.
  void Finish();

 private:
  void AppendSequence(std::span<const int64_t> tokens);
  std::string prefix_;
  TokenDType dtype_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> document_starts_{0};  // sequence ids where documents begin, and the end
  int64_t bin_bytes_ = 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> bin_;
};

}  // namespace tessel::zoo
