#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/multi_tensor.h"

namespace tessel::cuda {
namespace {

// One block's share: up to kChunk elements of one tensor pair.
struct Chunk {
  const void* src;
  void* dst;
  int64_t n;
};
constexpr int64_t kChunk = 1 << 16;

// The chunk table on the device (in a tensor, so the caching allocator
// keeps it and frees it in stream order).
Tensor ChunkTable(const char* op, const std::vector<Tensor>& src, const std::vector<Tensor>& dst,
                  int64_t* count) {
  TESSEL_CHECK(src.size() == dst.size())
      << op << ": " << src.size() << " sources but " << dst.size() << " destinations";
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < src.size(); ++t) {
    TESSEL_CHECK(src[t].numel() == dst[t].numel() && src[t].device().is_cuda() && dst[t].device().is_cuda())
        << op << ": pair " << t << " is " << src[t].ToString() << " -> " << dst[t].ToString()
        << "; expected CUDA tensors of equal sizes";
    const size_t ss = ElementSize(src[t].dtype()), ds = ElementSize(dst[t].dtype());
    for (int64_t off = 0; off < src[t].numel(); off += kChunk) {
      chunks.push_back({static_cast<const char*>(src[t].raw_data()) + off * ss,
                        static_cast<char*>(dst[t].raw_data()) + off * ds,
                        std::min(kChunk, src[t].numel() - off)});
    }
  }
  *count = static_cast<int64_t>(chunks.size());
  const int64_t words = (*count * static_cast<int64_t>(sizeof(Chunk)) + 7) / 8;
  Tensor table = Tensor::Empty({std::max<int64_t>(words, 1)}, DType::kInt64,
                               dst.empty() ? Device::CUDA(0) : dst[0].device());
  if (*count > 0) {
    // From pageable memory: the call returns once the table is staged, so
    // `chunks` may go.
    Check(cudaMemcpyAsync(table.raw_data(), chunks.data(), chunks.size() * sizeof(Chunk),
                          cudaMemcpyHostToDevice, CurrentStream()),
          "cudaMemcpyAsync (chunk table)");
  }
  return table;
}

template <typename TSrc>
__global__ void UnscaleKernel(const Chunk* chunks, float scale, double* partial) {
  const Chunk c = chunks[blockIdx.x];
  const TSrc* src = static_cast<const TSrc*>(c.src);
  float* dst = static_cast<float*>(c.dst);
  double acc = 0;
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) {
    const float v = ToF32(src[i]) * scale;
    dst[i] = v;
    acc += static_cast<double>(v) * v;
  }
  __shared__ double sums[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += sums[w];
    partial[blockIdx.x] = total;
  }
}

// One block adds the per-chunk sums in a fixed order (deterministic).
__global__ void NormKernel(const double* partial, int64_t n, float* norm) {
  __shared__ double sums[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *norm = static_cast<float>(sqrt(sums[0]));
}

template <typename TDst>
__global__ void CastKernel(const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const float* src = static_cast<const float*>(c.src);
  TDst* dst = static_cast<TDst*>(c.dst);
  for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) dst[i] = FromF32<TDst>(src[i]);
}

DType OnlyDType(const char* op, const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    TESSEL_CHECK(t.dtype() == ts[0].dtype()) << op << ": tensors of " << ts[0].dtype() << " and " << t.dtype()
                                             << " in one call; expected one dtype";
  return ts.empty() ? DType::kFloat32 : ts[0].dtype();
}

}  // namespace

Tensor UnscaleAndNorm(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double scale) {
  TESSEL_CHECK(!dst.empty()) << "UnscaleAndNorm of no tensors";
  SetDevice(dst[0].device());
  TESSEL_CHECK(OnlyDType("UnscaleAndNorm", dst) == DType::kFloat32) << "UnscaleAndNorm writes f32";
  const DType from = OnlyDType("UnscaleAndNorm", src);
  int64_t count = 0;
  const Tensor table = ChunkTable("UnscaleAndNorm", src, dst, &count);
  // Per-chunk sums of squares as doubles, in an i64 tensor of the same width.
  const Tensor partial = Tensor::Empty({std::max<int64_t>(count, 1)}, DType::kInt64, dst[0].device());
  Tensor norm = Tensor::Empty(Shape(std::vector<int64_t>{}), DType::kFloat32, dst[0].device());
  Zero(partial);
  const auto* chunks = static_cast<const Chunk*>(table.raw_data());
  auto* sums = static_cast<double*>(partial.raw_data());
  if (count > 0) {
    const auto grid = static_cast<unsigned>(count);
    if (from == DType::kBFloat16) {
      UnscaleKernel<__nv_bfloat16>
          <<<grid, kThreads, 0, CurrentStream()>>>(chunks, static_cast<float>(scale), sums);
    } else if (from == DType::kFloat16) {
      UnscaleKernel<__half><<<grid, kThreads, 0, CurrentStream()>>>(chunks, static_cast<float>(scale), sums);
    } else {
      TESSEL_CHECK(from == DType::kFloat32) << "UnscaleAndNorm reads f32, bf16 or f16, got " << from;
      UnscaleKernel<float><<<grid, kThreads, 0, CurrentStream()>>>(chunks, static_cast<float>(scale), sums);
    }
    CheckLaunch("UnscaleKernel");
  }
  NormKernel<<<1, kThreads, 0, CurrentStream()>>>(sums, count, static_cast<float*>(norm.raw_data()));
  CheckLaunch("NormKernel");
  return norm;
}

void CastInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst) {
  if (dst.empty()) return;
  SetDevice(dst[0].device());
  TESSEL_CHECK(OnlyDType("CastInto", src) == DType::kFloat32) << "CastInto reads f32";
  const DType to = OnlyDType("CastInto", dst);
  int64_t count = 0;
  const Tensor table = ChunkTable("CastInto", src, dst, &count);
  if (count == 0) return;
  const auto* chunks = static_cast<const Chunk*>(table.raw_data());
  const auto grid = static_cast<unsigned>(count);
  if (to == DType::kBFloat16) {
    CastKernel<__nv_bfloat16><<<grid, kThreads, 0, CurrentStream()>>>(chunks);
  } else if (to == DType::kFloat16) {
    CastKernel<__half><<<grid, kThreads, 0, CurrentStream()>>>(chunks);
  } else {
    TESSEL_CHECK(to == DType::kFloat32) << "CastInto writes f32, bf16 or f16, got " << to;
    CastKernel<float><<<grid, kThreads, 0, CurrentStream()>>>(chunks);
  }
  CheckLaunch("CastKernel");
}

}  // namespace tessel::cuda
