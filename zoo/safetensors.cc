#include "zoo/safetensors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace tessel::zoo {

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

void WriteSafetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    TESSEL_CHECK(t.defined() && !t.is_global() && !t.is_lazy() && t.device().is_cpu())
        << "safetensors: tensor '" << name << "' for " << path.string()
        << " must be a defined local host tensor (gather a global one first)";
    TESSEL_CHECK(name != "__metadata__" && names.insert(name).second)
        << "safetensors: tensor name '" << name << "' given twice (or reserved) for " << path.string();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * ElementSize(t.dtype());
    header[name] = {{"dtype", SafetensorsDType(t.dtype())},
                    {"shape", t.shape().dims()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();  // nlohmann's objects keep their keys sorted
  text.append((8 - text.size() % 8) % 8, ' ');

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
  for (const auto& [name, t] : tensors)
    write(t.raw_data(), static_cast<size_t>(t.numel()) * ElementSize(t.dtype()));
  TESSEL_CHECK(std::fflush(file.get()) == 0)
      << "safetensors: writing " << path.string() << " failed: " << std::strerror(errno);
}

}  // namespace tessel::zoo
