// What every CUDA kernel file shares: error checks, the stream kernels run
// on, launch shapes, and an N-D indexer for strided and broadcast reads.
// Included only by .cu files (ops/cuda/); the kernels' host entry points
// are declared in plain C++ headers beside them, with the signatures of
// their CPU twins in ops/cpu/.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace tessel::cuda {

// Throws an Error naming `what` and CUDA's message when err is not success.
void Check(cudaError_t err, const char* what);
// Checks the last launch (a bad configuration shows here, not at the call).
inline void CheckLaunch(const char* kernel) { Check(cudaGetLastError(), kernel); }

// The stream the kernels of this thread run on. Every kernel, copy and
// memset of the CUDA backend goes on it, so work is ordered without host
// synchronisation, and the caching allocator may hand a freed block to the
// next kernel at once: the work that freed it is already ahead in the
// stream. Today it is the legacy default stream, which also orders
// Tensor::To's cudaMemcpy with the kernels.
inline cudaStream_t CurrentStream() { return nullptr; }

// Makes `device` current for this thread (cheap when it already is).
void SetDevice(const Device& device);

// Throws naming `op` unless every defined tensor of `ts` is on `device`.
void CheckOnDevice(const char* op, const Device& device, const std::vector<Tensor>& ts);

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n elements: enough to fill the GPU,
// few enough that each thread does several elements of a huge tensor.
inline unsigned Blocks(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, 65535LL * 8));
}

#define TESSEL_CUDA_GRID_LOOP(i, n)                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Maps a flat row-major index of an output of `dims` to an element offset
// of an input read with `strides` per output dimension: 0 where the input
// is broadcast, a permuted stride for a transpose, and `base` for a slice.
struct StridedIndexer {
  static constexpr int kMaxDims = 8;
  int ndim = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t base = 0;
  __host__ __device__ int64_t operator()(int64_t flat) const {
    int64_t offset = base;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t q = flat / dims[d];
      offset += (flat - q * dims[d]) * strides[d];
      flat = q;
    }
    return offset;
  }
};

// The indexer reading `input` (row-major, shape `in_shape`) as an operand
// broadcast to `out_shape` (NumPy rules: trailing dims align; size-1 or
// missing input dims broadcast).
StridedIndexer BroadcastIndexer(const Shape& in_shape, const Shape& out_shape);
// The indexer reading x permuted: output dim i is x's dim perm[i].
StridedIndexer PermuteIndexer(const Shape& x_shape, const std::vector<int64_t>& perm);

// Zeroes t's bytes on the current stream.
void Zero(const Tensor& t);

}  // namespace tessel::cuda
