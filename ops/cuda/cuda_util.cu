#include <sstream>

#include "ops/cuda/cuda_util.cuh"

namespace tessel::cuda {

void Check(cudaError_t err, const char* what) {
  TESSEL_CHECK_CODE(err == cudaSuccess, StatusCode::kInternal)
      << what << " failed: " << cudaGetErrorString(err) << " (CUDA error " << static_cast<int>(err) << ")";
}

void SetDevice(const Device& device) {
  thread_local int current = -1;
  if (current == device.index()) return;
  Check(cudaSetDevice(device.index()), "cudaSetDevice");
  current = device.index();
}

void CheckOnDevice(const char* op, const Device& device, const std::vector<Tensor>& ts) {
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    TESSEL_CHECK(ts[i].device() == device)
        << op << ": input " << i << " " << ts[i].ToString() << " is on " << ts[i].device() << ", expected "
        << device << "; move it with .To() first";
  }
}

StridedIndexer BroadcastIndexer(const Shape& in_shape, const Shape& out_shape) {
  TESSEL_CHECK(out_shape.ndim() <= StridedIndexer::kMaxDims)
      << "CUDA kernels take at most " << StridedIndexer::kMaxDims << " dimensions, got " << out_shape;
  StridedIndexer ix;
  ix.ndim = static_cast<int>(out_shape.ndim());
  int64_t stride = 1;
  for (int64_t d = out_shape.ndim() - 1; d >= 0; --d) {
    ix.dims[d] = out_shape[d];
    int64_t id = d - (out_shape.ndim() - in_shape.ndim());
    if (id >= 0 && in_shape[id] != 1) {
      TESSEL_CHECK(in_shape[id] == out_shape[d]) << "cannot broadcast " << in_shape << " to " << out_shape;
      ix.strides[d] = stride;
    }
    if (id >= 0) stride *= in_shape[id];
  }
  return ix;
}

StridedIndexer PermuteIndexer(const Shape& x_shape, const std::vector<int64_t>& perm) {
  TESSEL_CHECK(x_shape.ndim() <= StridedIndexer::kMaxDims)
      << "CUDA kernels take at most " << StridedIndexer::kMaxDims << " dimensions, got " << x_shape;
  std::vector<int64_t> x_strides(x_shape.ndim(), 1);
  for (int64_t d = x_shape.ndim() - 2; d >= 0; --d) x_strides[d] = x_strides[d + 1] * x_shape[d + 1];
  StridedIndexer ix;
  ix.ndim = static_cast<int>(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    ix.dims[i] = x_shape[perm[i]];
    ix.strides[i] = x_strides[perm[i]];
  }
  return ix;
}

void Zero(const Tensor& t) {
  if (t.nbytes() == 0) return;
  Check(cudaMemsetAsync(t.raw_data(), 0, t.nbytes(), CurrentStream()), "cudaMemsetAsync");
}

}  // namespace tessel::cuda
