#include "core/tensor.h"

#include <sstream>

#include "core/philox.h"

namespace tessel {

#ifdef TESSEL_HAS_CUDA
void CudaCopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                   size_t bytes);  // core/cuda/cuda_copy.cu
#endif

void CopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef TESSEL_HAS_CUDA
  CudaCopyBytes(dst, dst_device, src, src_device, bytes);
#else
  TESSEL_THROW(StatusCode::kUnavailable) << "copy from " << src_device << " to " << dst_device
                                         << " needs the CUDA backend, which this build lacks";
#endif
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * ElementSize(dtype), device);
  return t;
}

void Tensor::CheckAccess(DType requested) const {
  TESSEL_CHECK(defined()) << "access to the data of an undefined tensor";
  TESSEL_CHECK(requested == dtype_) << "data<" << requested << ">() on a tensor of dtype " << dtype_;
  TESSEL_CHECK(device().is_cpu()) << "host access to a tensor on " << device()
                                  << "; move it with .To(Device::CPU()) first";
  TESSEL_CHECK(!is_global()) << "element access to a global tensor of shape " << logical_shape_
                             << "; use to_local() for this process's shard";
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.autograd_.reset();
  return t;
}

Tensor Tensor::metadata_only() const {
  Tensor t = detach();
  t.storage_.reset();
  return t;
}

Tensor Tensor::to_local() const {
  Tensor t = *this;
  t.global_.reset();
  t.autograd_.reset();
  t.logical_shape_ = Shape();
  return t;
}

Tensor Tensor::WrapGlobal(const Tensor& local, const Shape& logical_shape,
                          std::shared_ptr<const GlobalMeta> meta) {
  Tensor t = local.to_local();
  t.global_ = std::move(meta);
  t.logical_shape_ = logical_shape;
  return t;
}

Tensor Tensor::Clone() const {  // a new tensor: no autograd state
  Tensor t = Empty(shape_, dtype_, device());
  CopyBytes(t.raw_data(), t.device(), raw_data(), device(), nbytes());
  return is_global() ? WrapGlobal(t, logical_shape_, global_) : t;
}

Tensor Tensor::To(Device device) const {
  if (device == this->device()) return *this;
  Tensor t = Empty(shape_, dtype_, device);
  CopyBytes(t.raw_data(), t.device(), raw_data(), this->device(), nbytes());
  return is_global() ? WrapGlobal(t, logical_shape_, global_) : t;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  TESSEL_CHECK(!is_global()) << "Reshape of a global tensor (" << logical_shape_ << ") is not a local "
                             << "operation; reshape its to_local() shard or use fn::reshape";
  TESSEL_CHECK(shape.numel() == numel()) << "cannot reshape " << shape_ << " (" << numel() << " elements) to "
                                         << shape << " (" << shape.numel() << " elements)";
  Tensor t = detach();  // a view of the data, not of the autograd node
  t.shape_ = shape;
  return t;
}

void Tensor::CopyFrom(const Tensor& src) {
  TESSEL_CHECK(!is_global() && !src.is_global()) << "CopyFrom copies local tensors; use to_local() shards";
  TESSEL_CHECK(src.shape() == shape_ && src.dtype() == dtype_)
      << "CopyFrom needs equal shape and dtype: destination " << ToString() << ", source " << src.ToString();
  CopyBytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

std::string Tensor::ToString() const {
  std::ostringstream os;
  os << "Tensor(" << dtype_ << ", " << shape() << ", " << device();
  if (is_global()) os << ", global, local " << shape_;
  os << ")";
  return os.str();
}

namespace {
// Host buffer of `shape` filled by fn(i) (a double), converted to `dtype`.
template <typename Fn>
Tensor MakeOnHost(const Shape& shape, DType dtype, Device device, Fn fn) {
  Tensor t = Tensor::Empty(shape, dtype);
  int64_t n = shape.numel();
  VisitDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      double v = fn(i);
      if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
        p[i] = T(static_cast<float>(v));
      } else {
        p[i] = static_cast<T>(v);
      }
    }
  });
  return t.To(device);
}
}  // namespace

Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return MakeOnHost(shape, dtype, device, [value](int64_t) { return value; });
}

Tensor arange(const Shape& shape, DType dtype, Device device) {
  return MakeOnHost(shape, dtype, device, [](int64_t i) { return static_cast<double>(i); });
}

Tensor rand(const Shape& shape, uint64_t seed, uint64_t offset, DType dtype, Device device) {
  TESSEL_CHECK(IsFloating(dtype)) << "rand needs a floating dtype, got " << dtype;
  Philox gen(seed);
  return MakeOnHost(shape, dtype, device,
                    [&](int64_t i) { return gen.Uniform(offset + static_cast<uint64_t>(i)); });
}

Tensor randn(const Shape& shape, uint64_t seed, uint64_t offset, DType dtype, Device device) {
  TESSEL_CHECK(IsFloating(dtype)) << "randn needs a floating dtype, got " << dtype;
  Philox gen(seed);
  return MakeOnHost(shape, dtype, device,
                    [&](int64_t i) { return gen.Normal(offset + static_cast<uint64_t>(i)); });
}

}  // namespace tessel
