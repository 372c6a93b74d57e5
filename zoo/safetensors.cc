#include "zoo/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tessel::zoo {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit, for readers and writers
}  // namespace

std::string SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  TESSEL_THROW(StatusCode::kInvalidArgument) << "safetensors: no name for dtype " << static_cast<int>(dtype);
}

DType DTypeOfSafetensors(const std::string& dtype, const std::string& where) {
  static const std::map<std::string, DType> kDTypes = {{"F32", DType::kFloat32},   {"F16", DType::kFloat16},
                                                       {"BF16", DType::kBFloat16}, {"I32", DType::kInt32},
                                                       {"I64", DType::kInt64},     {"BOOL", DType::kBool}};
  auto it = kDTypes.find(dtype);
  TESSEL_CHECK(it != kDTypes.end()) << "safetensors: " << (where.empty() ? "" : where + " is of ") << "dtype "
                                    << dtype
                                    << ", not one tessel holds; expected F32, F16, BF16, I32, I64 or BOOL";
  return it->second;
}

void WriteSafetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSource> sources;
  sources.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK(t.defined() && !t.is_global() && !t.is_lazy() && t.device().is_cpu())
        << "safetensors: tensor '" << name << "' for " << path.string()
        << " must be a defined local host tensor (gather a global one first)";
    const Tensor tensor = t;
    sources.push_back(
        {name, SafetensorsDType(t.dtype()), t.shape().dims(), [tensor](const SafetensorsSource::Sink& write) {
           write(tensor.raw_data(), static_cast<size_t>(tensor.numel()) * ElementSize(tensor.dtype()));
         }});
  }
  WriteSafetensors(path, sources, metadata);
}

void WriteSafetensors(const std::filesystem::path& path, const std::vector<SafetensorsSource>& sources,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const SafetensorsSource& source : sources) {
    TESSEL_CHECK(source.name != "__metadata__" && names.insert(source.name).second)
        << "safetensors: tensor name '" << source.name << "' given twice (or reserved) for " << path.string();
    uint64_t bytes = SafetensorsElementSize(source.dtype);
    for (int64_t d : source.shape) {
      TESSEL_CHECK(d >= 0) << "safetensors: tensor '" << source.name << "' for " << path.string()
                           << " has a negative dimension";
      bytes *= static_cast<uint64_t>(d);
    }
    header[source.name] = {
        {"dtype", source.dtype}, {"shape", source.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  std::string text = header.dump();  // nlohmann's objects keep their keys sorted
  text.append((8 - text.size() % 8) % 8, ' ');
  TESSEL_CHECK(text.size() <= kMaxHeaderBytes)
      << "safetensors: the header for " << path.string() << " (" << sources.size() << " tensors) would be "
      << text.size() << " bytes; readers refuse more than " << kMaxHeaderBytes
      << " (write fewer, larger tensors)";

  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  TESSEL_CHECK(file != nullptr) << "safetensors: cannot write " << path.string() << ": "
                                << std::strerror(errno);
  auto write = [&](const void* data, size_t size) {
    TESSEL_CHECK(size == 0 || std::fwrite(data, 1, size, file.get()) == size)
        << "safetensors: writing " << path.string() << " failed: " << std::strerror(errno);
  };
  uint8_t size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<uint8_t>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  write(size_bytes, 8);
  write(text.data(), text.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    uint64_t written = 0;
    sources[i].fill([&](const void* data, size_t bytes) {
      TESSEL_CHECK(written + bytes <= sizes[i])
          << "safetensors: tensor '" << sources[i].name << "' for " << path.string() << " gave more than its "
          << sizes[i] << " bytes";
      write(data, bytes);
      written += bytes;
    });
    TESSEL_CHECK(written == sizes[i])
        << "safetensors: tensor '" << sources[i].name << "' for " << path.string() << " gave " << written
        << " of its " << sizes[i] << " bytes";
  }
  TESSEL_CHECK(std::fflush(file.get()) == 0)
      << "safetensors: writing " << path.string() << " failed: " << std::strerror(errno);
}

size_t SafetensorsElementSize(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  auto it = kSizes.find(dtype);
  TESSEL_CHECK(it != kSizes.end()) << "safetensors: unknown dtype '" << dtype
                                   << "'; expected one of BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, "
                                      "F64, I64, U64, F8_E5M2, F8_E4M3";
  return it->second;
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
constexpr uint64_t kMaxDim = uint64_t{1} << 48;
}  // namespace

SafetensorsHeader ParseSafetensorsHeader(const uint8_t* data, size_t size, const std::string& name) {
  TESSEL_CHECK(size >= 8) << "safetensors: " << name << " is " << size
                          << " bytes; expected at least the 8-byte header size";
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | data[i];
  TESSEL_CHECK(header_bytes <= kMaxHeaderBytes && header_bytes <= size - 8)
      << "safetensors: " << name << " declares a header of " << header_bytes << " bytes; expected at most "
      << std::min<uint64_t>(kMaxHeaderBytes, size - 8) << " (the file's size less 8, and 100 MB)";
  const char* text = reinterpret_cast<const char*>(data + 8);
  const nlohmann::json json =
      nlohmann::json::parse(text, text + header_bytes, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(json.is_object()) << "safetensors: the header of " << name
                                 << " is not a JSON object (malformed JSON or another format)";
  SafetensorsHeader header;
  header.data_offset = 8 + header_bytes;
  const uint64_t data_bytes = size - header.data_offset;
  std::vector<std::pair<uint64_t, const std::string*>> ranges;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      TESSEL_CHECK(value.is_object()) << "safetensors: __metadata__ of " << name << " is not a JSON object";
      for (const auto& [k, v] : value.items()) {
        TESSEL_CHECK(v.is_string()) << "safetensors: metadata '" << k << "' of " << name
                                    << " is not a string; expected a map of strings";
        header.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    // A named copy: lambdas may not capture structured bindings before C++20 in clang 14.
    const std::string tensor_name = key;
    auto where = [&] { return "safetensors: tensor '" + tensor_name + "' of " + name; };
    TESSEL_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                 value.contains("data_offsets"))
        << where() << " needs an object with dtype, shape and data_offsets";
    const nlohmann::json &dtype = value["dtype"], &shape = value["shape"], &offsets = value["data_offsets"];
    TESSEL_CHECK(dtype.is_string()) << where() << ": dtype is not a string";
    SafetensorsEntry entry;
    entry.dtype = dtype.get<std::string>();
    const uint64_t element = SafetensorsElementSize(entry.dtype);
    TESSEL_CHECK(shape.is_array()) << where() << ": shape is not an array";
    uint64_t numel = 1;
    for (const nlohmann::json& d : shape) {
      TESSEL_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= kMaxDim)
          << where() << ": shape " << shape.dump() << " holds " << d.dump()
          << "; expected non-negative integers below 2^48";
      TESSEL_CHECK(!__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel))
          << where() << ": shape " << shape.dump() << " has more elements than fit 64 bits";
      entry.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    TESSEL_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                 offsets[1].is_number_unsigned())
        << where() << ": data_offsets " << offsets.dump() << "; expected [begin, end], non-negative integers";
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    uint64_t bytes = 0;
    TESSEL_CHECK(!__builtin_mul_overflow(numel, element, &bytes) && entry.begin <= entry.end &&
                 entry.end - entry.begin == bytes)
        << where() << ": data_offsets " << offsets.dump() << " span " << entry.end - entry.begin
        << " bytes; expected " << numel << " elements x " << element << " bytes of " << entry.dtype;
    TESSEL_CHECK(entry.end <= data_bytes) << where() << ": data_offsets " << offsets.dump()
                                          << " end past the data section of " << data_bytes << " bytes";
    auto [it, inserted] = header.entries.emplace(key, std::move(entry));
    TESSEL_CHECK(inserted) << where() << " is listed twice";
    ranges.emplace_back(it->second.begin, &it->first);
  }
  // The data section is the tensors one after another: no holes, no overlap.
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;
  for (const auto& [begin, key] : ranges) {
    TESSEL_CHECK(begin == next) << "safetensors: tensor '" << *key << "' of " << name << " starts at byte "
                                << begin << " of the data; expected " << next
                                << " (tensors are packed without holes or overlap)";
    next = header.entries.at(*key).end;
  }
  TESSEL_CHECK(next == data_bytes) << "safetensors: the tensors of " << name << " cover " << next
                                   << " bytes of a data section of " << data_bytes
                                   << " (a truncated or padded file)";
  return header;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, Access access) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSEL_CHECK(fd >= 0) << "safetensors: cannot open " << path.string() << ": " << std::strerror(errno);
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_error = errno;
  if (stat_ok && st.st_size > 0) {
    size_ = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<const uint8_t*>(p);
    // Advice only: a kernel that ignores it reads more, never less.
    if (data_ != nullptr && access == Access::kRandom) ::madvise(p, size_, MADV_RANDOM);
  }
  const int map_error = errno;
  ::close(fd);
  TESSEL_CHECK(stat_ok) << "safetensors: cannot stat " << path.string() << ": " << std::strerror(stat_error);
  TESSEL_CHECK(size_ == 0 || data_ != nullptr)
      << "safetensors: cannot map " << path.string() << ": " << std::strerror(map_error);
  static const uint8_t kEmpty[1] = {0};
  try {
    header_ = ParseSafetensorsHeader(data_ != nullptr ? data_ : kEmpty, size_, path.string());
  } catch (...) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = header_.entries.find(name);
  if (it == header_.entries.end()) {
    std::string names;
    for (const auto& [k, e] : header_.entries) names += (names.empty() ? "" : ", ") + k;
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "safetensors: " << path_.string() << " holds no tensor '" << name << "'; it holds: " << names;
  }
  return it->second;
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return {data_ + header_.data_offset + e.begin, static_cast<size_t>(e.end - e.begin)};
}

uint64_t SafetensorsFile::file_offset(const std::string& name) const {
  return header_.data_offset + entry(name).begin;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  Tensor t = Tensor::Empty(Shape(e.shape),
                           DTypeOfSafetensors(e.dtype, "tensor '" + name + "' of " + path_.string()));
  const std::span<const uint8_t> b = bytes(name);
  if (!b.empty()) std::memcpy(t.raw_data(), b.data(), b.size());
  return t;
}

}  // namespace tessel::zoo
