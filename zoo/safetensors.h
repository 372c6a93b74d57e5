// safetensors files (Hugging Face's tensor format): an 8-byte little-endian
// header size N, N bytes of JSON naming each tensor's dtype, shape and byte
// range [begin, end) in the data that follows, then the data, row-major,
// little-endian. The header may hold "__metadata__", a map of strings.
// Readers elsewhere (the `safetensors` package, transformers) load what this
// writes; ReadSafetensors reads what they write.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tessel::zoo {

// The safetensors name of a dtype: "F32", "F16", "BF16", "I32", "I64", "BOOL".
std::string SafetensorsDType(DType dtype);
// The dtype a safetensors name stands for; throws naming it (and `where`,
// the tensor and file it belongs to) for the format's other dtypes (U8,
// F64, ...), which tessel does not compute in.
DType DTypeOfSafetensors(const std::string& dtype, const std::string& where = "");

// Writes local (host) tensors under their names, in the order given (the
// header lists them sorted, as the format's own writer does; the data keeps
// this order). The header is padded with spaces to a multiple of 8 bytes so
// the data is aligned. Throws naming the tensor for a global, lazy or
// undefined tensor, or a repeated name, and naming the path if it cannot be
// written.
void WriteSafetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A tensor written by parts, without a tensor in memory: its name, dtype
// (a safetensors name), shape, and `fill`, which hands its bytes (row-major,
// little-endian) to `write` in one or more calls.
struct SafetensorsSource {
  using Sink = std::function<void(const void* data, size_t bytes)>;
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::function<void(const Sink& write)> fill;
};

// Writes `sources` in the order given, each filled when its turn comes, so a
// file of any size is written from the caller's buffers (a box of a shard,
// a tensor loaded one at a time). Throws naming the tensor if its fill
// writes another number of bytes than its dtype and shape say, and the
// others as the tensor overload does.
void WriteSafetensors(const std::filesystem::path& path, const std::vector<SafetensorsSource>& sources,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor's entry in a header: its dtype as the file names it ("F32",
// "U8", ... any of the format's), its shape and its bytes [begin, end) in
// the data section.
struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  int64_t numel() const;
};
struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafetensorsEntry> entries;
  uint64_t data_offset = 0;  // where the data section starts in the file
};
// Bytes per element of a safetensors dtype name; throws naming it if unknown.
size_t SafetensorsElementSize(const std::string& dtype);

// Parses the header of a safetensors image of `size` bytes and checks it
// against the format: a header size that fits the file (and at most 100
// MB, the format's limit), a JSON object, each tensor with a known dtype,
// non-negative dims whose product times the element size is its byte range,
// the ranges packed one after another from 0 without holes or overlap up to
// the end of the file, metadata of strings. Throws naming `name`, the tensor
// and the expected value for anything else. Allocates by the header's text
// only, never by its counts.
SafetensorsHeader ParseSafetensorsHeader(const uint8_t* data, size_t size, const std::string& name);

// A safetensors file, memory-mapped (nothing is read until asked for, so a
// dataset or checkpoint larger than memory opens) and checked
// (ParseSafetensorsHeader).
class SafetensorsFile {
 public:
  // kSequential leaves the kernel's read-ahead on (a dataset read in
  // order); kRandom turns it off for the mapping (MADV_RANDOM), so touching
  // a page reads that page and not megabytes around it: a reader that takes
  // a few parts of a large file (a checkpoint shard) reads only those.
  enum class Access { kSequential, kRandom };
  // Throws naming the path if it is missing, unreadable or malformed.
  explicit SafetensorsFile(const std::filesystem::path& path, Access access = Access::kSequential);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return header_.entries; }
  bool contains(const std::string& name) const { return header_.entries.count(name) > 0; }
  // The entry of `name`; throws naming the file and the names it holds if absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  // The bytes of `name` (little-endian, row-major).
  std::span<const uint8_t> bytes(const std::string& name) const;
  // Where the bytes of `name` start in the file (for pread).
  uint64_t file_offset(const std::string& name) const;
  // `name` as a host tensor (F32, F16, BF16, I32, I64, BOOL); throws naming
  // the dtype for the others (read those through bytes()).
  Tensor tensor(const std::string& name) const;

 private:
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
};

}  // namespace tessel::zoo
