// A tensor handle: a shared pointer to an implementation (core/tensor_impl.h)
// that is eager local data, an eager global tensor's shard and layout, or a
// lazy value (metadata, no storage). Copies of a Tensor share the
// implementation — memory and autograd state — like torch.Tensor; Clone()
// deep-copies. Global layouts (placement + SBP) are defined in sbp/.
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
#include "core/tensor_impl.h"

namespace tessel {

// Defined in sbp/. Core only carries a global tensor's layout (GlobalMeta),
// the way a tensor carries autograd metadata it does not interpret, so core
// stays free of sbp includes.
class Placement;
class NdSbp;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  static Tensor Empty(const Shape& shape, DType dtype, Device device = Device::CPU());
  // A lazy local value: metadata without storage (a global one is made by
  // sbp/'s MakeLazyGlobal). `value` links it to a trace; null: none.
  static Tensor Lazy(const Shape& shape, DType dtype, Device device = Device::CPU(),
                     std::shared_ptr<const LazyValue> value = nullptr);

  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, const Shape& shape);

  // Whether this handle points to a tensor (eager or lazy).
  bool defined() const { return impl_ != nullptr; }
  TensorKind kind() const { return impl().kind(); }
  // A lazy tensor has metadata and no data (see core/tensor_impl.h).
  bool is_lazy() const { return impl_ && impl_->kind() == TensorKind::kLazy; }
  // The logical shape: for a global tensor the whole tensor's, not the shard's.
  const Shape& shape() const { return impl().shape(); }
  DType dtype() const { return impl().dtype(); }
  Device device() const { return impl().device(); }
  int64_t numel() const { return shape().numel(); }
  int64_t ndim() const { return shape().ndim(); }
  // Bytes of the data this process holds (the local shard of a global
  // tensor; 0 for a lazy one).
  size_t nbytes() const {
    const TensorImpl& t = impl();
    return t.storage() ? static_cast<size_t>(t.local_shape().numel()) * ElementSize(t.dtype()) : 0;
  }

  // Global tensors (see sbp/global_tensor.h), eager or lazy. placement()
  // and nd_sbp() are defined in sbp/, to_global() in graph/ (it
  // communicates).
  bool is_global() const { return impl_ && impl_->global_meta() != nullptr; }
  const Placement& placement() const;
  const NdSbp& nd_sbp() const;
  Tensor to_global(const Placement& placement, const NdSbp& nd_sbp) const;
  // The same, and the gradient flowing back is brought to `grad_sbp` (on
  // this tensor's placement) instead of this tensor's own layout, even when
  // the layout does not change (like OneFlow's grad_sbp): a column-parallel
  // layer passes B there, which all-reduces its input gradient over tp.
  Tensor to_global(const Placement& placement, const NdSbp& nd_sbp, const NdSbp& grad_sbp) const;
  // This process's shard as a local tensor (shares memory, no autograd
  // state); a local tensor returns itself. Throws for a lazy global tensor.
  Tensor to_local() const;
  const std::shared_ptr<const GlobalMeta>& global_meta() const { return impl().global_meta(); }
  // The implementation (null for an undefined tensor).
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // The traced value of a lazy tensor (null if none or not lazy).
  std::shared_ptr<const LazyValue> lazy_value() const;

  // Autograd (defined in graph/autograd.cc). State lives in the
  // implementation, so every handle of a tensor sees it.
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
  // A new handle to the same data and layout, cut from the autograd graph.
  Tensor detach() const;
  // A lazy tensor with this tensor's shape, dtype, device and layout and no
  // data (no autograd state): what autograd keeps of a value a gradient
  // does not read. Reading its data throws.
  Tensor metadata_only() const;
  std::shared_ptr<AutogradMeta> autograd_meta() const { return impl_ ? impl_->autograd : nullptr; }
  void set_autograd_meta(std::shared_ptr<AutogradMeta> meta) { impl().autograd = std::move(meta); }
  void* raw_data() const { return impl_ && impl_->storage() ? impl_->storage()->data() : nullptr; }
  // Typed host pointer to local data; throws naming both dtypes if T does
  // not match, or if the tensor is global (use to_local()) or lazy.
  template <typename T>
  T* data() const {
    CheckAccess(DTypeOf<T>::value);
    return static_cast<T*>(raw_data());
  }
  template <typename T>
  std::vector<T> ToVector() const {
    const T* p = data<T>();
    return std::vector<T>(p, p + impl_->local_shape().numel());
  }

  Tensor Clone() const;
  Tensor To(Device device) const;
  // Same storage, new shape with the same number of elements.
  Tensor Reshape(const Shape& shape) const;
  // Copies `src` (same shape and dtype, any device) into this tensor.
  void CopyFrom(const Tensor& src);

  std::string ToString() const;  // "Tensor(f32, [2, 3], cpu)"

 private:
  // The implementation; throws if the tensor is undefined.
  TensorImpl& impl() const {
    if (!impl_) ThrowUndefined();
    return *impl_;
  }
  [[noreturn]] static void ThrowUndefined();
  void CheckAccess(DType requested) const;
  void CheckEager(const char* what) const;
  // Wraps `local` as the shard of a global tensor. Only sbp/'s MakeGlobal,
  // which checks that the shard fits the layout, makes global tensors.
  static Tensor WrapGlobal(const Tensor& local, const Shape& logical_shape,
                           std::shared_ptr<const GlobalMeta> meta);
  friend Tensor MakeGlobal(const Tensor& local, const Shape& logical, const Placement& placement,
                           const NdSbp& nd_sbp);
  friend Tensor WrapShard(const Tensor& local, const Shape& logical,
                          const std::shared_ptr<const GlobalMeta>& meta, const Shape& shard, bool member);

  std::shared_ptr<TensorImpl> impl_;
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
  } else if (!values.empty()) {  // an empty tensor has no storage: memcpy of null is undefined
    std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  }
  return t;
}

}  // namespace tessel
