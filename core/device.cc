#include "core/device.h"

#include <charconv>
#include <cstdlib>

#include "core/comm/dist_env.h"
#include "core/error.h"
#ifdef TESSEL_HAS_CUDA
#include "core/cuda/cuda_runtime.h"
#endif

namespace tessel {

Device::Device(DeviceType type, int index) : type_(type), index_(index) {
  TESSEL_CHECK(index >= 0) << "device index " << index << " is negative; expected >= 0";
  TESSEL_CHECK(type != DeviceType::kCPU || index == 0)
      << "cpu device has index " << index << "; the host is always cpu (index 0)";
}

std::string_view DeviceTypeName(DeviceType type) { return type == DeviceType::kCPU ? "cpu" : "cuda"; }

DeviceType ParseDeviceType(std::string_view text) {
  if (text == "cpu") return DeviceType::kCPU;
  if (text == "cuda" || text == "gpu") return DeviceType::kCUDA;
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "unknown device type '" << text << "'; expected 'cpu' or 'cuda'";
}

Device Device::Parse(std::string_view text) {
  size_t colon = text.find(':');
  DeviceType type = ParseDeviceType(text.substr(0, colon));
  if (colon == std::string_view::npos) return Device(type, 0);
  std::string_view idx = text.substr(colon + 1);
  int index = -1;
  auto [ptr, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
  TESSEL_CHECK(ec == std::errc() && ptr == idx.data() + idx.size() && index >= 0)
      << "bad device '" << text << "'; expected 'cpu', 'cuda' or 'cuda:N' with N >= 0";
  return Device(type, index);
}

Device RankDevice(DeviceType type) {
  if (type == DeviceType::kCPU) return Device::CPU();
#ifdef TESSEL_HAS_CUDA
  static const int index = [] {
    const int count = cuda::DeviceCount();
    TESSEL_CHECK_CODE(count > 0, StatusCode::kUnavailable)
        << "a cuda placement needs a CUDA device, but none is visible (CUDA_VISIBLE_DEVICES='"
        << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "") << "')";
    return comm::ReadDistEnv().local_rank % count;
  }();
  return Device::CUDA(index);
#else
  TESSEL_THROW(StatusCode::kUnavailable)
      << "a cuda placement needs the CUDA backend, and this build of tessel has none (nvcc was not found "
         "when it was configured); use cpu placements";
#endif
}

std::string Device::ToString() const {
  if (is_cpu()) return "cpu";
  return "cuda:" + std::to_string(index_);
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.ToString(); }

}  // namespace tessel
