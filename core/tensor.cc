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
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * ElementSize(dtype), device);
  return Tensor(std::make_shared<LocalTensorImpl>(std::move(storage), shape, dtype));
}

Tensor Tensor::Lazy(const Shape& shape, DType dtype, Device device, std::shared_ptr<const LazyValue> value) {
  return Tensor(std::make_shared<LazyTensorImpl>(shape, dtype, device, nullptr, std::move(value)));
}

void Tensor::ThrowUndefined() {
  TESSEL_THROW(StatusCode::kInvalidArgument) << "use of an undefined tensor (a default-constructed Tensor, "
                                             << "or a gradient that was never computed)";
}

std::shared_ptr<const LazyValue> Tensor::lazy_value() const {
  if (!is_lazy()) return nullptr;
  return static_cast<const LazyTensorImpl&>(*impl_).value();
}

void Tensor::CheckEager(const char* what) const {
  TESSEL_CHECK(defined()) << what << " of an undefined tensor";
  TESSEL_CHECK(!is_lazy()) << what << " of a lazy tensor " << ToString()
                           << ", which has no data: it stands for a value being traced into a graph, "
                           << "or one autograd kept as metadata only";
}

void Tensor::CheckAccess(DType requested) const {
  CheckEager("data access");
  TESSEL_CHECK(requested == dtype()) << "data<" << requested << ">() on a tensor of dtype " << dtype();
  TESSEL_CHECK(device().is_cpu()) << "host access to a tensor on " << device()
                                  << "; move it with .To(Device::CPU()) first";
  TESSEL_CHECK(!is_global()) << "element access to a global tensor of shape " << shape()
                             << "; use to_local() for this process's shard";
}

Tensor Tensor::detach() const {
  const TensorImpl& t = impl();
  switch (t.kind()) {
    case TensorKind::kLocal:
      return Tensor(std::make_shared<LocalTensorImpl>(t.storage(), t.shape(), t.dtype()));
    case TensorKind::kGlobal:
      return Tensor(std::make_shared<GlobalTensorImpl>(t.storage(), t.local_shape(), t.shape(), t.dtype(),
                                                       t.global_meta()));
    case TensorKind::kLazy:
      return Tensor(std::make_shared<LazyTensorImpl>(t.shape(), t.dtype(), t.device(), t.global_meta(),
                                                     static_cast<const LazyTensorImpl&>(t).value()));
  }
  return Tensor();
}

Tensor Tensor::metadata_only() const {
  const TensorImpl& t = impl();
  return Tensor(std::make_shared<LazyTensorImpl>(t.shape(), t.dtype(), t.device(), t.global_meta(), nullptr));
}

Tensor Tensor::to_local() const {
  const TensorImpl& t = impl();
  if (t.global_meta() == nullptr) return *this;
  CheckEager("to_local()");
  return Tensor(std::make_shared<LocalTensorImpl>(t.storage(), t.local_shape(), t.dtype()));
}

Tensor Tensor::WrapGlobal(const Tensor& local, const Shape& logical_shape,
                          std::shared_ptr<const GlobalMeta> meta) {
  local.CheckEager("making a global tensor");
  const TensorImpl& t = local.impl();
  return Tensor(std::make_shared<GlobalTensorImpl>(t.storage(), t.local_shape(), logical_shape, t.dtype(),
                                                   std::move(meta)));
}

Tensor Tensor::Clone() const {  // a new tensor: no autograd state
  CheckEager("Clone()");
  Tensor t = Empty(impl_->local_shape(), dtype(), device());
  CopyBytes(t.raw_data(), t.device(), raw_data(), device(), nbytes());
  return is_global() ? WrapGlobal(t, shape(), global_meta()) : t;
}

Tensor Tensor::To(Device device) const {
  CheckEager("To()");
  if (device == this->device()) return *this;
  Tensor t = Empty(impl_->local_shape(), dtype(), device);
  CopyBytes(t.raw_data(), t.device(), raw_data(), this->device(), nbytes());
  return is_global() ? WrapGlobal(t, shape(), global_meta()) : t;
}

Tensor Tensor::Reshape(const Shape& shape) const {
  CheckEager("Reshape()");
  TESSEL_CHECK(!is_global()) << "Reshape of a global tensor (" << this->shape() << ") is not a local "
                             << "operation; reshape its to_local() shard or use fn::reshape";
  TESSEL_CHECK(shape.numel() == numel())
      << "cannot reshape " << this->shape() << " (" << numel() << " elements) to " << shape << " ("
      << shape.numel() << " elements)";
  // A view of the data, not of the autograd node.
  return Tensor(std::make_shared<LocalTensorImpl>(impl_->storage(), shape, dtype()));
}

void Tensor::CopyFrom(const Tensor& src) {
  CheckEager("CopyFrom()");
  src.CheckEager("CopyFrom()");
  TESSEL_CHECK(!is_global() && !src.is_global()) << "CopyFrom copies local tensors; use to_local() shards";
  TESSEL_CHECK(src.shape() == shape() && src.dtype() == dtype())
      << "CopyFrom needs equal shape and dtype: destination " << ToString() << ", source " << src.ToString();
  CopyBytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

std::string Tensor::ToString() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype() << ", " << shape() << ", " << device();
  if (is_global()) os << ", global";
  if (is_lazy()) {
    os << ", lazy";
  } else if (is_global()) {
    os << ", local " << impl_->local_shape();
  }
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
