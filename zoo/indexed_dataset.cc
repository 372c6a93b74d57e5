#include "zoo/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace tessel::zoo {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T Load(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

bool IsTokenDType(uint8_t code) { return code >= 1 && code <= 8 && code != 6 && code != 7; }

// Token i of `count` tokens at `data` as int64.
int64_t TokenAt(const uint8_t* data, TokenDType dtype, int64_t i) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return data[i];
    case TokenDType::kInt8:
      return Load<int8_t>(data + i);
    case TokenDType::kInt16:
      return Load<int16_t>(data + 2 * i);
    case TokenDType::kUInt16:
      return Load<uint16_t>(data + 2 * i);
    case TokenDType::kInt32:
      return Load<int32_t>(data + 4 * i);
    case TokenDType::kInt64:
      return Load<int64_t>(data + 8 * i);
    case TokenDType::kFloat32:
    case TokenDType::kFloat64:
      break;
  }
  TESSEL_THROW(StatusCode::kInternal)
      << "indexed dataset: dtype code " << static_cast<int>(dtype) << " is not a token dtype";
}

}  // namespace

size_t TokenBytes(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16:
      return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64:
      return 8;
  }
  return 0;
}

TokenDType TokenDTypeForVocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

int32_t IndexedDatasetIndex::length(size_t i) const { return Load<int32_t>(lengths_at + 4 * i); }
int64_t IndexedDatasetIndex::offset(size_t i) const { return Load<int64_t>(offsets_at + 8 * i); }
int64_t IndexedDatasetIndex::document_index(size_t k) const { return Load<int64_t>(documents_at + 8 * k); }

IndexedDatasetIndex ParseIndex(const uint8_t* data, size_t size, uint64_t bin_bytes,
                               const std::string& name) {
  TESSEL_CHECK(size >= kHeaderBytes) << "indexed dataset " << name << ": " << size
                                     << " bytes, shorter than the " << kHeaderBytes
                                     << "-byte header (truncated or not an .idx file)";
  TESSEL_CHECK(std::memcmp(data, kMagic, sizeof(kMagic)) == 0)
      << "indexed dataset " << name
      << ": does not start with MMIDIDX; expected a Megatron memory-mapped index";
  const uint64_t version = Load<uint64_t>(data + 9);
  TESSEL_CHECK(version == kVersion) << "indexed dataset " << name << ": version " << version
                                    << "; expected version " << kVersion;
  const uint8_t code = data[17];
  TESSEL_CHECK(IsTokenDType(code)) << "indexed dataset " << name << ": dtype code " << static_cast<int>(code)
                                   << "; expected an integer token dtype (1-5 or 8)";
  const uint64_t n = Load<uint64_t>(data + 18), d = Load<uint64_t>(data + 26);
  // Sizes in the file are checked against its length before anything else
  // is read, without overflow: each count is bounded by the bytes present.
  const uint64_t body = size - kHeaderBytes;
  TESSEL_CHECK(n <= body / 12 && d <= (body - 12 * n) / 8 && d >= 1)
      << "indexed dataset " << name << ": the header promises " << n << " sequences and " << d
      << " document indices (" << kHeaderBytes << " + 12 x " << n << " + 8 x " << d
      << " bytes) but the file has " << size << " bytes (truncated?)";
  const uint64_t expected = kHeaderBytes + 12 * n + 8 * d;
  TESSEL_CHECK(size == expected) << "indexed dataset " << name << ": " << size << " bytes; the header's " << n
                                 << " sequences and " << d << " document indices take exactly " << expected
                                 << " (extra data: another version or a multimodal index)";
  IndexedDatasetIndex index;
  index.dtype = static_cast<TokenDType>(code);
  index.num_sequences = n;
  index.num_document_indices = d;
  index.lengths_at = data + kHeaderBytes;
  index.offsets_at = index.lengths_at + 4 * n;
  index.documents_at = index.offsets_at + 8 * n;
  const uint64_t item = TokenBytes(index.dtype);
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t length = index.length(i);
    const int64_t offset = index.offset(i);
    TESSEL_CHECK(length >= 0) << "indexed dataset " << name << ": sequence " << i << " has length " << length
                              << "; expected 0 or more";
    TESSEL_CHECK(offset >= 0 && offset % static_cast<int64_t>(item) == 0 &&
                 static_cast<uint64_t>(offset) <= bin_bytes &&
                 static_cast<uint64_t>(length) * item <= bin_bytes - static_cast<uint64_t>(offset))
        << "indexed dataset " << name << ": sequence " << i << " (" << length << " tokens at byte " << offset
        << ") does not lie within the " << bin_bytes << "-byte .bin";
  }
  TESSEL_CHECK(index.document_index(0) == 0 && static_cast<uint64_t>(index.document_index(d - 1)) == n)
      << "indexed dataset " << name << ": document indices run from " << index.document_index(0) << " to "
      << index.document_index(d - 1) << "; expected 0 to the sequence count " << n;
  for (uint64_t k = 1; k < d; ++k)
    TESSEL_CHECK(index.document_index(k) >= index.document_index(k - 1))
        << "indexed dataset " << name << ": document index " << k << " (" << index.document_index(k)
        << ") is below the one before (" << index.document_index(k - 1) << ")";
  return index;
}

struct IndexedDataset::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;

  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TESSEL_CHECK(fd >= 0) << "indexed dataset: cannot open " << path << ": " << std::strerror(errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int error = errno;
      ::close(fd);
      TESSEL_THROW(StatusCode::kInvalidArgument)
          << "indexed dataset: cannot stat " << path << ": " << std::strerror(error);
    }
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      const int error = errno;
      ::close(fd);
      TESSEL_CHECK(p != MAP_FAILED) << "indexed dataset: cannot map " << path << ": " << std::strerror(error);
      data = static_cast<const uint8_t*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), size);
  }
};

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix),
      idx_(std::make_unique<Mapping>(prefix + ".idx")),
      bin_(std::make_unique<Mapping>(prefix + ".bin")) {
  static const uint8_t kEmpty[1] = {0};
  index_ = ParseIndex(idx_->data != nullptr ? idx_->data : kEmpty, idx_->size, bin_->size, prefix + ".idx");
}

IndexedDataset::~IndexedDataset() = default;

void IndexedDataset::Read(size_t i, int64_t offset, int64_t count, std::vector<int64_t>* out) const {
  TESSEL_CHECK(i < num_sequences() && offset >= 0 && count >= 0 && offset + count <= sequence_length(i))
      << "indexed dataset " << prefix_ << ": tokens [" << offset << ", " << offset + count << ") of sequence "
      << i << " are out of range (" << num_sequences() << " sequences, this one "
      << (i < num_sequences() ? sequence_length(i) : 0) << " tokens)";
  const uint8_t* at = bin_->data + index_.offset(i) + offset * static_cast<int64_t>(TokenBytes(dtype()));
  for (int64_t t = 0; t < count; ++t) out->push_back(TokenAt(at, dtype(), t));
}

int64_t IndexedDataset::MaxToken() const {
  if (max_token_ >= 0) return max_token_;
  int64_t max_token = 0;
  for (size_t i = 0; i < num_sequences(); ++i) {
    const uint8_t* at = bin_->data + index_.offset(i);
    for (int64_t t = 0; t < sequence_length(i); ++t) max_token = std::max(max_token, TokenAt(at, dtype(), t));
  }
  max_token_ = max_token;
  return max_token_;
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype)
    : prefix_(prefix), dtype_(dtype), bin_(std::fopen((prefix + ".bin").c_str(), "wb"), &std::fclose) {
  TESSEL_CHECK(IsTokenDType(static_cast<uint8_t>(dtype)))
      << "indexed dataset writer: dtype code " << static_cast<int>(dtype) << " is not an integer token dtype";
  TESSEL_CHECK(bin_ != nullptr) << "indexed dataset writer: cannot create " << prefix
                                << ".bin: " << std::strerror(errno);
}

void IndexedDatasetWriter::AddDocument(std::span<const int64_t> tokens) {
  AppendSequence(tokens);
  document_starts_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::AddSentences(const std::vector<std::vector<int64_t>>& sentences) {
  for (const std::vector<int64_t>& s : sentences) AppendSequence(s);
  document_starts_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::AppendSequence(std::span<const int64_t> tokens) {
  TESSEL_CHECK(bin_ != nullptr) << "indexed dataset writer " << prefix_ << ": a document added after Finish";
  TESSEL_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
      << "indexed dataset writer " << prefix_ << ": a document of " << tokens.size()
      << " tokens; the format holds at most 2^31 - 1 per sequence";
  const size_t item = TokenBytes(dtype_);
  std::string bytes;
  bytes.reserve(tokens.size() * item);
  for (int64_t token : tokens) {
    bool fits = false;
    switch (dtype_) {
      case TokenDType::kUInt8:
        fits = token >= 0 && token <= 255;
        Append(&bytes, static_cast<uint8_t>(token));
        break;
      case TokenDType::kInt8:
        fits = token >= -128 && token <= 127;
        Append(&bytes, static_cast<int8_t>(token));
        break;
      case TokenDType::kInt16:
        fits = token >= -32768 && token <= 32767;
        Append(&bytes, static_cast<int16_t>(token));
        break;
      case TokenDType::kUInt16:
        fits = token >= 0 && token <= 65535;
        Append(&bytes, static_cast<uint16_t>(token));
        break;
      case TokenDType::kInt32:
        fits = token >= std::numeric_limits<int32_t>::min() && token <= std::numeric_limits<int32_t>::max();
        Append(&bytes, static_cast<int32_t>(token));
        break;
      case TokenDType::kInt64:
        fits = true;
        Append(&bytes, token);
        break;
      case TokenDType::kFloat32:
      case TokenDType::kFloat64:
        break;
    }
    TESSEL_CHECK(fits) << "indexed dataset writer " << prefix_ << ": token " << token
                       << " does not fit dtype code " << static_cast<int>(dtype_);
  }
  TESSEL_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), bin_.get()) == bytes.size())
      << "indexed dataset writer: writing " << prefix_ << ".bin failed: " << std::strerror(errno);
  offsets_.push_back(bin_bytes_);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  bin_bytes_ += static_cast<int64_t>(bytes.size());
}

void IndexedDatasetWriter::Finish() {
  TESSEL_CHECK(bin_ != nullptr) << "indexed dataset writer " << prefix_ << ": Finish called twice";
  TESSEL_CHECK(std::fflush(bin_.get()) == 0)
      << "indexed dataset writer: writing " << prefix_ << ".bin failed: " << std::strerror(errno);
  bin_.reset();
  std::string idx(kMagic, sizeof(kMagic));
  Append(&idx, kVersion);
  Append(&idx, static_cast<uint8_t>(dtype_));
  const uint64_t n = lengths_.size();
  Append(&idx, n);
  Append(&idx, static_cast<uint64_t>(document_starts_.size()));  // the documents' starts and the end
  for (int32_t length : lengths_) Append(&idx, length);
  for (int64_t offset : offsets_) Append(&idx, offset);
  for (int64_t start : document_starts_) Append(&idx, start);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out(std::fopen((prefix_ + ".idx").c_str(), "wb"),
                                                      &std::fclose);
  TESSEL_CHECK(out != nullptr) << "indexed dataset writer: cannot create " << prefix_
                               << ".idx: " << std::strerror(errno);
  TESSEL_CHECK(std::fwrite(idx.data(), 1, idx.size(), out.get()) == idx.size() && std::fflush(out.get()) == 0)
      << "indexed dataset writer: writing " << prefix_ << ".idx failed: " << std::strerror(errno);
}

}  // namespace tessel::zoo
