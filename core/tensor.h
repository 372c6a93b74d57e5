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

// Defined in sbp/: what makes a tensor global (placement and NdSbp). Core
// only carries it, the way a tensor carries autograd metadata it does not
// interpret, so core stays free of sbp includes.
class GlobalMeta;
class Placement;
class NdSbp;
// Defined in graph/autograd.h: the tensor's place in the autograd graph.
class AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  static Tensor Empty(const Shape& shape, DType dtype, Device device = Device::CPU());

  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  // The logical shape: for a global tensor the whole tensor's, not the shard's.
  const Shape& shape() const { return global_ ? logical_shape_ : shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU(); }
  int64_t numel() const { return shape().numel(); }
  int64_t ndim() const { return shape().ndim(); }
  // Bytes of the data this process holds (the local shard of a global tensor).
  size_t nbytes() const { return static_cast<size_t>(shape_.numel()) * ElementSize(dtype_); }

  // Global tensors (see sbp/global_tensor.h). placement() and nd_sbp() are
  // defined in sbp/, to_global() in graph/ (it communicates).
  bool is_global() const { return global_ != nullptr; }
  const Placement& placement() const;
  const NdSbp& nd_sbp() const;
  Tensor to_global(const Placement& placement, const NdSbp& nd_sbp) const;
  // The same, and the gradient flowing back is brought to `grad_sbp` (on
  // this tensor's placement) instead of this tensor's own layout, even when
  // the layout does not change (like OneFlow's grad_sbp): a column-parallel
  // layer passes B there, which all-reduces its input gradient over tp.
  Tensor to_global(const Placement& placement, const NdSbp& nd_sbp, const NdSbp& grad_sbp) const;
  // This process's shard as a local tensor (shares memory); a local tensor
  // returns itself.
  Tensor to_local() const;
  const std::shared_ptr<const GlobalMeta>& global_meta() const { return global_; }

  // Autograd (defined in graph/autograd.cc). Copies of a tensor share its
  // autograd state only if made after set_requires_grad / the op that made it.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);
  // The accumulated gradient of a leaf (undefined until backward reaches it).
  Tensor grad() const;
  // Replaces a leaf's accumulated gradient (an optimizer's reduction or
  // clipping); the tensor must require gradients.
  void set_grad(const Tensor& grad);
  void zero_grad();
  // Backpropagates from this tensor (a scalar unless `gradient` is given);
  // the graph is released afterwards.
  void backward() const;
  void backward(const Tensor& gradient) const;
  // The same data and layout, cut from the autograd graph.
  Tensor detach() const;
  // The same shape, dtype and layout without the data (and cut from the
  // autograd graph): what autograd keeps of a value a gradient does not
  // read. defined() is false; reading its data throws.
  Tensor metadata_only() const;
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return autograd_; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) { autograd_ = std::move(meta); }
  void* raw_data() const { return storage_ ? storage_->data() : nullptr; }
  // Typed host pointer to local data; throws naming both dtypes if T does
  // not match, or if the tensor is global (use to_local()).
  template <typename T>
  T* data() const {
    CheckAccess(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  std::vector<T> ToVector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + shape_.numel());
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
  // Wraps `local` as the shard of a global tensor. Only sbp/'s MakeGlobal,
  // which checks that the shard fits the layout, makes global tensors.
  static Tensor WrapGlobal(const Tensor& local, const Shape& logical_shape,
                           std::shared_ptr<const GlobalMeta> meta);
  friend Tensor MakeGlobal(const Tensor& local, const Shape& logical, const Placement& placement,
                           const NdSbp& nd_sbp);

  std::shared_ptr<Storage> storage_;
  Shape shape_;  // of the local data
  DType dtype_ = DType::kFloat32;
  std::shared_ptr<const GlobalMeta> global_;  // null for a local tensor
  Shape logical_shape_;                       // global tensors only
  std::shared_ptr<AutogradMeta> autograd_;    // null: no autograd state
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
