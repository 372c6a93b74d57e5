// Where a tensor's memory lives: the host CPU or one CUDA device.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

namespace tessel {

enum class DeviceType { kCPU, kCUDA };

class Device {
 public:
  Device() = default;
  Device(DeviceType type, int index = 0);
  static Device CPU() { return Device(DeviceType::kCPU, 0); }
  static Device CUDA(int index) { return Device(DeviceType::kCUDA, index); }
  // Parses "cpu", "cuda", "cuda:1"; throws naming the text otherwise.
  static Device Parse(std::string_view text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCPU; }
  bool is_cuda() const { return type_ == DeviceType::kCUDA; }
  std::string ToString() const;  // "cpu" or "cuda:N"
  bool operator==(const Device& o) const { return type_ == o.type_ && index_ == o.index_; }

 private:
  DeviceType type_ = DeviceType::kCPU;
  int index_ = 0;
};

std::string_view DeviceTypeName(DeviceType type);
// This process's device of `type`, where a rank of a placement of that type
// keeps its shards: the host for cpu; for cuda, visible GPU LOCAL_RANK modulo
// the number of visible GPUs, so ranks on one node spread over its GPUs and
// several ranks may share one (their collectives then go through the host).
// Throws, naming the type, when the build has no CUDA backend.
Device RankDevice(DeviceType type);
DeviceType ParseDeviceType(std::string_view text);
std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace tessel
