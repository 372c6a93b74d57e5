// A local, contiguous, reference-counted tensor: storage + shape + dtype.
//
// Copies of a Tensor share memory (like torch.Tensor); Clone() deep-copies.
// Global tensors (placement + SBP) build on this in sbp/.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tessel {

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  static Tensor Empty(const Shape& shape, DType dtype, Device device = Device::CPU());

  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU(); }
  int64_t numel() const { return shape_.numel(); }
  int64_t ndim() const { return shape_.ndim(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * ElementSize(dtype_); }

  void* raw_data() const { return storage_ ? storage_->data() : nullptr; }
  // Typed host pointer; throws naming both dtypes if T does not match.
  template <typename T>
  T* data() const {
    CheckAccess(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  std::vector<T> ToVector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + numel());
  }

  Tensor Clone() const;
  Tensor To(Device device) const;
  // Same storage, new shape with the same number of elements.
  Tensor Reshape(const Shape& shape) const;
  // Copies `src` (same shape and dtype, any device) into this tensor.
  void CopyFrom(const Tensor& src);

  std::string ToString() const;  // "Tensor(f32, [2, 3], cpu)"

 private:
  void CheckAccess(DType requested) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::kFloat32;
};

// Copies bytes between any two devices (host and CUDA).
void CopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device, size_t bytes);

// Factories. Values are created on the host and moved to `device`.
Tensor zeros(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
Tensor ones(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
Tensor full(const Shape& shape, double value, DType dtype = DType::kFloat32, Device device = Device::CPU());
// 0, 1, ..., numel-1 in row-major order, reshaped to `shape`.
Tensor arange(const Shape& shape, DType dtype = DType::kFloat32, Device device = Device::CPU());
// Uniform [0,1) / standard normal, element i drawn from Philox(seed) at
// `offset + i`, so a slice of a larger random tensor can be made alone.
Tensor rand(const Shape& shape, uint64_t seed, uint64_t offset = 0, DType dtype = DType::kFloat32,
            Device device = Device::CPU());
Tensor randn(const Shape& shape, uint64_t seed, uint64_t offset = 0, DType dtype = DType::kFloat32,
             Device device = Device::CPU());

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, const Shape& shape) {
  TESSEL_CHECK(static_cast<int64_t>(values.size()) == shape.numel())
      << "FromVector got " << values.size() << " values for shape " << shape << " (" << shape.numel()
      << " elements expected)";
  Tensor t = Empty(shape, DTypeOf<T>::value);
  if constexpr (std::is_same_v<T, bool>) {
    for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i];
  } else {
    std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

}  // namespace tessel
