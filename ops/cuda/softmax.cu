#include <cstdint>
#include <type_traits>

#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/softmax.h"

namespace tessel::cuda {
namespace {

// Rows up to kMaxWarpCols long take one warp each, held in registers (read
// once); longer rows take a block each and are read twice (the second read
// mostly hits the cache).
constexpr int kRowWarps = 4;  // rows per block on the warp path
constexpr int64_t kMaxWarpCols = 1024;

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T WarpAllReduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread of the block gets the result.
template <typename T, typename Op>
__device__ T BlockAllReduce(T v, T identity, Op op) {
  __shared__ T scratch[32];
  v = WarpAllReduce(v, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpAllReduce(lane < warps ? scratch[lane] : identity, op);
}

// Which keys of a row are visible: the causal limit and the mask.
struct Visibility {
  const bool* mask = nullptr;  // null: no mask
  StridedIndexer mask_index;   // x's flat index -> the mask's
  int64_t mask_step = 0;       // the mask's step along x's last dim (1, or 0 where broadcast)
  bool causal = false;
  int64_t q = 1;  // x's second-to-last dim
};

struct RowVisibility {
  int64_t last;  // the last visible column (causal), or past the end
  const bool* mask;
  int64_t step;
  __device__ bool operator()(int64_t c) const { return c <= last && (mask == nullptr || mask[c * step]); }
};

__device__ __forceinline__ RowVisibility ForRow(const Visibility& v, int64_t row, int64_t cols) {
  RowVisibility r;
  r.last = v.causal ? row % v.q + cols - v.q : cols;
  r.mask = v.mask ? v.mask + v.mask_index(row * cols) : nullptr;
  r.step = v.mask_step;
  return r;
}

template <int kVec>
__device__ __forceinline__ void Load(const float* p, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = p[e];
  }
}

template <int kVec>
__device__ __forceinline__ void Store(float* p, const float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[e] = v[e];
  }
}

// Lane l holds columns l, l + 32, ...: each load is one coalesced line.
template <int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    SoftmaxWarpKernel(const float* __restrict__ x, float* __restrict__ y, int64_t rows, int64_t cols,
                      float scale, Visibility vis) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float* xr = x + row * cols;
  const RowVisibility keep = ForRow(vis, row, cols);
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = c < cols && c <= keep.last ? xr[c] : 0.0f;  // causally hidden scores are not read
  }
  uint32_t kept = 0;
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols && keep(c)) {
      kept |= 1u << j;
      v[j] *= scale;
      mx = fmaxf(mx, v[j]);
    }
  }
  mx = WarpAllReduce(mx, MaxOp());
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    v[j] = (kept >> j & 1u) ? expf(v[j] - mx) : 0.0f;
    sum += v[j];
  }
  sum = WarpAllReduce(sum, SumOp());
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  float* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) yr[c] = v[j] * inv;
  }
}

// One block per row: a pass for the running max and sum of exponentials
// (rescaled when the max grows), a pass writing the probabilities. kVec = 4
// needs cols % 4 == 0 and 16-byte aligned rows.
template <int kVec>
__global__ void SoftmaxBlockKernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols,
                                   float scale, Visibility vis) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  const RowVisibility keep = ForRow(vis, row, cols);
  // Causally hidden scores are not read (a vector is, if any of it is
  // visible).
  const int64_t end = min(cols, keep.last + 1);
  float m = -INFINITY, s = 0.0f;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < end;
       i += static_cast<int64_t>(blockDim.x) * kVec) {
    float v[kVec];
    Load<kVec>(xr + i, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (!keep(i + e)) continue;
      const float a = v[e] * scale;
      if (a > m) {
        s = s * expf(m - a) + 1.0f;
        m = a;
      } else if (a != -INFINITY) {  // -inf adds nothing (and a NaN poisons the sum, as on the CPU)
        s += expf(a - m);
      }
    }
  }
  const float mx = BlockAllReduce(m, -INFINITY, MaxOp());
  const float sum = BlockAllReduce(s == 0.0f ? 0.0f : s * expf(m - mx), 0.0f, SumOp());
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  float* yr = y + row * cols;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols;
       i += static_cast<int64_t>(blockDim.x) * kVec) {
    float v[kVec] = {};
    if (i < end) {
      Load<kVec>(xr + i, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[e] = keep(i + e) ? expf(v[e] * scale - mx) * inv : 0.0f;
    }
    Store<kVec>(yr + i, v);
  }
}

template <int kPerLane>
__global__ void __launch_bounds__(kRowWarps * 32)
    SoftmaxGradWarpKernel(const float* __restrict__ y, const float* __restrict__ dy, float* __restrict__ dx,
                          int64_t rows, int64_t cols, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const float* yr = y + row * cols;
  const float* gr = dy + row * cols;
  float yv[kPerLane], gv[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    yv[j] = c < cols ? yr[c] : 0.0f;
    gv[j] = c < cols ? gr[c] : 0.0f;
  }
  double dot = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) dot += static_cast<double>(yv[j]) * gv[j];
  const float d = static_cast<float>(WarpAllReduce(dot, SumOp()));
  float* out = dx + row * cols;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) out[c] = scale * yv[j] * (gv[j] - d);
  }
}

template <int kVec>
__global__ void SoftmaxGradBlockKernel(const float* __restrict__ y, const float* __restrict__ dy,
                                       float* __restrict__ dx, int64_t cols, float scale) {
  const int64_t row = blockIdx.x;
  const float* yr = y + row * cols;
  const float* gr = dy + row * cols;
  double dot = 0;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols;
       i += static_cast<int64_t>(blockDim.x) * kVec) {
    float yv[kVec], gv[kVec];
    Load<kVec>(yr + i, yv);
    Load<kVec>(gr + i, gv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) dot += static_cast<double>(yv[e]) * gv[e];
  }
  const float d = static_cast<float>(BlockAllReduce(dot, 0.0, SumOp()));
  float* out = dx + row * cols;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols;
       i += static_cast<int64_t>(blockDim.x) * kVec) {
    float yv[kVec], gv[kVec];
    Load<kVec>(yr + i, yv);
    Load<kVec>(gr + i, gv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) yv[e] = scale * yv[e] * (gv[e] - d);
    Store<kVec>(out + i, yv);
  }
}

// Calls f(std::integral_constant<int, P>) with P the power of two of
// columns per lane that covers `cols` (<= kMaxWarpCols).
template <typename F>
void WithPerLane(int64_t cols, F&& f) {
  if (cols <= 32) {
    f(std::integral_constant<int, 1>());
  } else if (cols <= 64) {
    f(std::integral_constant<int, 2>());
  } else if (cols <= 128) {
    f(std::integral_constant<int, 4>());
  } else if (cols <= 256) {
    f(std::integral_constant<int, 8>());
  } else if (cols <= 512) {
    f(std::integral_constant<int, 16>());
  } else {
    f(std::integral_constant<int, 32>());
  }
}

unsigned WarpBlocks(int64_t rows) { return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps); }

int BlockThreads(int64_t cols) { return cols <= 4096 ? 256 : cols <= 16384 ? 512 : 1024; }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void CheckRows(int64_t rows) {
  TESSEL_CHECK(rows <= 0x7fffffffLL) << "softmax on CUDA takes at most 2^31 - 1 rows; got " << rows;
}

}  // namespace

Tensor Softmax(const Tensor& x, const SoftmaxOptions& options) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && x.ndim() >= 1)
      << "softmax needs an f32 tensor of rank >= 1; got " << x.dtype() << " " << x.shape();
  const int64_t cols = x.shape()[-1], rows = cols == 0 ? 0 : x.numel() / cols;
  const int64_t q = x.ndim() >= 2 ? x.shape()[-2] : 1;
  TESSEL_CHECK(!options.causal || x.ndim() >= 2)
      << "causal softmax needs [..., q, k] scores; got " << x.shape();
  const bool masked = options.mask.defined();
  if (masked) {
    TESSEL_CHECK(options.mask.dtype() == DType::kBool)
        << "softmax mask must be bool (true = keep); got " << options.mask.dtype();
    TESSEL_CHECK(cpu::BroadcastShapes(options.mask.shape(), x.shape()) == x.shape())
        << "softmax mask of shape " << options.mask.shape() << " does not broadcast to the scores "
        << x.shape();
  }
  CheckOnDevice("softmax", x.device(), {x, options.mask});
  SetDevice(x.device());
  Tensor out = Tensor::Empty(x.shape(), DType::kFloat32, x.device());
  if (rows == 0) return out;
  CheckRows(rows);
  Visibility vis;
  vis.causal = options.causal;
  vis.q = q;
  if (masked) {
    vis.mask = static_cast<const bool*>(options.mask.raw_data());
    vis.mask_index = BroadcastIndexer(options.mask.shape(), x.shape());
    vis.mask_step = vis.mask_index.strides[vis.mask_index.ndim - 1];
  }
  const float* px = static_cast<const float*>(x.raw_data());
  float* py = static_cast<float*>(out.raw_data());
  const cudaStream_t stream = CurrentStream();
  if (cols <= kMaxWarpCols) {
    WithPerLane(cols, [&](auto per_lane) {
      SoftmaxWarpKernel<decltype(per_lane)::value>
          <<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(px, py, rows, cols, options.scale, vis);
    });
  } else if (cols % 4 == 0 && Aligned16(px) && Aligned16(py)) {
    SoftmaxBlockKernel<4>
        <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(px, py, cols, options.scale, vis);
  } else {
    SoftmaxBlockKernel<1>
        <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(px, py, cols, options.scale, vis);
  }
  CheckLaunch("softmax kernel");
  return out;
}

Tensor SoftmaxGrad(const Tensor& y, const Tensor& dy, float scale) {
  TESSEL_CHECK(y.shape() == dy.shape())
      << "softmax gradient of shape " << dy.shape() << " for output " << y.shape();
  TESSEL_CHECK(y.dtype() == DType::kFloat32 && dy.dtype() == DType::kFloat32 && y.ndim() >= 1)
      << "softmax gradient needs f32 tensors of rank >= 1; got " << y.dtype() << " " << y.shape() << " and "
      << dy.dtype();
  CheckOnDevice("softmax_grad", y.device(), {y, dy});
  SetDevice(y.device());
  const int64_t cols = y.shape()[-1], rows = cols == 0 ? 0 : y.numel() / cols;
  Tensor out = Tensor::Empty(y.shape(), DType::kFloat32, y.device());
  if (rows == 0) return out;
  CheckRows(rows);
  const float* py = static_cast<const float*>(y.raw_data());
  const float* pg = static_cast<const float*>(dy.raw_data());
  float* pd = static_cast<float*>(out.raw_data());
  const cudaStream_t stream = CurrentStream();
  if (cols <= kMaxWarpCols) {
    WithPerLane(cols, [&](auto per_lane) {
      SoftmaxGradWarpKernel<decltype(per_lane)::value>
          <<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(py, pg, pd, rows, cols, scale);
    });
  } else if (cols % 4 == 0 && Aligned16(py) && Aligned16(pg) && Aligned16(pd)) {
    SoftmaxGradBlockKernel<4>
        <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(py, pg, pd, cols, scale);
  } else {
    SoftmaxGradBlockKernel<1>
        <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(py, pg, pd, cols, scale);
  }
  CheckLaunch("softmax_grad kernel");
  return out;
}

}  // namespace tessel::cuda
