#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/adamw_math.cuh"
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

// A table of plain structs on the device (in a tensor, so the caching
// allocator keeps it and frees it in stream order).
template <typename T>
Tensor DeviceTable(const std::vector<T>& rows, const Device& device) {
  const int64_t words = (static_cast<int64_t>(rows.size() * sizeof(T)) + 7) / 8;
  Tensor table = Tensor::Empty({std::max<int64_t>(words, 1)}, DType::kInt64, device);
  if (!rows.empty()) {
    // From pageable memory: the call returns once the table is staged, so
    // `rows` may go.
    Check(cudaMemcpyAsync(table.raw_data(), rows.data(), rows.size() * sizeof(T), cudaMemcpyHostToDevice,
                          CurrentStream()),
          "cudaMemcpyAsync (chunk table)");
  }
  return table;
}

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
  return DeviceTable(chunks, dst.empty() ? Device::CUDA(0) : dst[0].device());
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
__global__ void CastKernel(const Chunk* chunks, float scale) {
  const Chunk c = chunks[blockIdx.x];
  const float* src = static_cast<const float*>(c.src);
  TDst* dst = static_cast<TDst*>(c.dst);
  if (scale == 1.0f) {
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) dst[i] = FromF32<TDst>(src[i]);
  } else {
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x) dst[i] = FromF32<TDst>(src[i] * scale);
  }
}

// One block's share of the AdamW step: up to kChunk elements of one
// parameter, with that parameter's step counter and weight decay.
struct AdamWChunk {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  const int64_t* step;
  double weight_decay;
  int64_t n;
};

__global__ void CountStepsKernel(int64_t* const* steps, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ++*steps[i];
}

__global__ void AdamWChunkKernel(const AdamWChunk* chunks, const float* lr, double beta1, double beta2,
                                 double eps) {
  const AdamWChunk c = chunks[blockIdx.x];
  __shared__ AdamWCoef coef;
  if (threadIdx.x == 0) coef = MakeAdamWCoef(*lr, *c.step, beta1, beta2, c.weight_decay);
  __syncthreads();
  const AdamWCoef k = coef;
  const bool vec =
      c.n % 4 == 0 && (reinterpret_cast<uintptr_t>(c.param) | reinterpret_cast<uintptr_t>(c.grad) |
                       reinterpret_cast<uintptr_t>(c.exp_avg) | reinterpret_cast<uintptr_t>(c.exp_avg_sq)) %
                              16 ==
                          0;
  if (vec) {
    auto* p4 = reinterpret_cast<float4*>(c.param);
    const auto* g4 = reinterpret_cast<const float4*>(c.grad);
    auto* m4 = reinterpret_cast<float4*>(c.exp_avg);
    auto* v4 = reinterpret_cast<float4*>(c.exp_avg_sq);
    for (int64_t i = threadIdx.x; i < c.n / 4; i += blockDim.x) {
      float4 p = p4[i], g = g4[i], m = m4[i], v = v4[i];
      AdamWElement(p.x, g.x, m.x, v.x, k, beta1, beta2, eps);
      AdamWElement(p.y, g.y, m.y, v.y, k, beta1, beta2, eps);
      AdamWElement(p.z, g.z, m.z, v.z, k, beta1, beta2, eps);
      AdamWElement(p.w, g.w, m.w, v.w, k, beta1, beta2, eps);
      p4[i] = p;
      m4[i] = m;
      v4[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < c.n; i += blockDim.x)
      AdamWElement(c.param[i], c.grad[i], c.exp_avg[i], c.exp_avg_sq[i], k, beta1, beta2, eps);
  }
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

void CastInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double scale) {
  if (dst.empty()) return;
  SetDevice(dst[0].device());
  TESSEL_CHECK(OnlyDType("CastInto", src) == DType::kFloat32) << "CastInto reads f32";
  const DType to = OnlyDType("CastInto", dst);
  int64_t count = 0;
  const Tensor table = ChunkTable("CastInto", src, dst, &count);
  if (count == 0) return;
  const auto* chunks = static_cast<const Chunk*>(table.raw_data());
  const auto grid = static_cast<unsigned>(count);
  const auto s = static_cast<float>(scale);
  if (to == DType::kBFloat16) {
    CastKernel<__nv_bfloat16><<<grid, kThreads, 0, CurrentStream()>>>(chunks, s);
  } else if (to == DType::kFloat16) {
    CastKernel<__half><<<grid, kThreads, 0, CurrentStream()>>>(chunks, s);
  } else {
    TESSEL_CHECK(to == DType::kFloat32) << "CastInto writes f32, bf16 or f16, got " << to;
    CastKernel<float><<<grid, kThreads, 0, CurrentStream()>>>(chunks, s);
  }
  CheckLaunch("CastKernel");
}

void AdamWStep(const AdamWGroup& group, const Tensor& lr, double beta1, double beta2, double eps) {
  const size_t count = group.params.size();
  TESSEL_CHECK(group.grads.size() == count && group.exp_avgs.size() == count &&
               group.exp_avg_sqs.size() == count && group.steps.size() == count &&
               group.weight_decays.size() == count)
      << "AdamWStep: " << count << " params, " << group.grads.size() << " grads, " << group.exp_avgs.size()
      << " exp_avgs, " << group.exp_avg_sqs.size() << " exp_avg_sqs, " << group.steps.size() << " steps and "
      << group.weight_decays.size() << " weight decays; expected one of each per parameter";
  if (count == 0) return;
  TESSEL_CHECK(lr.dtype() == DType::kFloat32 && lr.numel() == 1 && lr.device().is_cuda())
      << "AdamWStep's lr must be an f32 scalar on the GPU; got " << lr.ToString();
  SetDevice(group.params[0].device());
  std::vector<AdamWChunk> chunks;
  std::vector<int64_t*> steps;
  for (size_t t = 0; t < count; ++t) {
    const Tensor& p = group.params[t];
    for (const Tensor* x : {&p, &group.grads[t], &group.exp_avgs[t], &group.exp_avg_sqs[t]}) {
      TESSEL_CHECK(x->dtype() == DType::kFloat32 && x->device() == p.device() && x->numel() == p.numel())
          << "AdamWStep: parameter " << t << " is " << p.ToString() << " but one of its tensors is "
          << x->ToString() << "; expected f32 of its size on its GPU";
    }
    const Tensor& step = group.steps[t];
    TESSEL_CHECK(step.dtype() == DType::kInt64 && step.numel() == 1 && step.device() == p.device())
        << "AdamWStep: parameter " << t << "'s step is " << step.ToString()
        << "; expected an i64 scalar on its GPU";
    steps.push_back(static_cast<int64_t*>(step.raw_data()));
    auto* pp = static_cast<float*>(p.raw_data());
    const auto* gp = static_cast<const float*>(group.grads[t].raw_data());
    auto* mp = static_cast<float*>(group.exp_avgs[t].raw_data());
    auto* vp = static_cast<float*>(group.exp_avg_sqs[t].raw_data());
    for (int64_t off = 0; off < p.numel(); off += kChunk) {
      chunks.push_back({pp + off, gp + off, mp + off, vp + off, steps.back(), group.weight_decays[t],
                        std::min(kChunk, p.numel() - off)});
    }
  }
  const Device device = group.params[0].device();
  // Every counter first, as adamw_update counts its own before the update.
  const Tensor step_table = DeviceTable(steps, device);
  CountStepsKernel<<<Blocks(static_cast<int64_t>(steps.size())), kThreads, 0, CurrentStream()>>>(
      static_cast<int64_t* const*>(step_table.raw_data()), static_cast<int64_t>(steps.size()));
  CheckLaunch("CountStepsKernel");
  if (chunks.empty()) return;
  const Tensor chunk_table = DeviceTable(chunks, device);
  AdamWChunkKernel<<<static_cast<unsigned>(chunks.size()), kThreads, 0, CurrentStream()>>>(
      static_cast<const AdamWChunk*>(chunk_table.raw_data()), static_cast<const float*>(lr.raw_data()), beta1,
      beta2, eps);
  CheckLaunch("AdamWChunkKernel");
}

}  // namespace tessel::cuda
