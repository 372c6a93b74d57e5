#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/row_util.cuh"
#include "ops/cuda/softmax.h"

namespace tessel::cuda {
namespace {

// Rows up to kMaxWarpCols long take one warp each, held in registers (read
// once); longer rows take a block each and are read twice (the second read
// mostly hits the cache).
constexpr int kRowWarps = 4;  // rows per block on the warp path
constexpr int64_t kMaxWarpCols = 1024;

// Which keys of a row are visible: the causal limit and the mask.
struct Visibility {
  const bool* mask = nullptr;  // null: no mask
  StridedIndexer mask_index;   // x's flat index -> the mask's
  int64_t mask_step = 0;       // the mask's step along x's last dim (1, or 0 where broadcast)
  bool causal = false;
  int64_t q = 1;                          // x's second-to-last dim
  int64_t query_offset = 0, queries = 1;  // x's rows among the logical queries (a split shard)
};

struct RowVisibility {
  int64_t last;      // the last visible column (causal), or past the end
  const bool* mask;  // per column; null: no mask, or one value for the row (row_keep)
  int64_t step;
  bool row_keep;
  __device__ bool operator()(int64_t c) const {
    return c <= last && (mask == nullptr ? row_keep : mask[c * step]);
  }
};

__device__ __forceinline__ RowVisibility ForRow(const Visibility& v, int64_t row, int64_t cols) {
  RowVisibility r;
  r.last = v.causal ? v.query_offset + row % v.q + cols - v.queries : cols;
  r.mask = v.mask ? v.mask + v.mask_index(row * cols) : nullptr;
  r.step = v.mask_step;
  r.row_keep = true;
  if (r.mask != nullptr && r.step == 0) {  // broadcast along the row: read once, not per column
    r.row_keep = *r.mask;
    r.mask = nullptr;
  }
  return r;
}

// exp in the scores' precision: the fast intrinsic for bf16 and f16 (its
// error is far below their rounding), the accurate one for f32, whose
// results match the CPU's within 1e-5.
template <typename T>
__device__ __forceinline__ float ExpFor(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return __expf(x);
  }
}

// Lane l holds columns l, l + 32, ...: each load is one coalesced line.
template <int kPerLane, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    SoftmaxWarpKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, float scale,
                      Visibility vis) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* xr = x + row * cols;
  const RowVisibility keep = ForRow(vis, row, cols);
  float v[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = c < cols && c <= keep.last ? ToF32(xr[c]) : 0.0f;  // causally hidden scores are not read
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
    v[j] = (kept >> j & 1u) ? ExpFor<T>(v[j] - mx) : 0.0f;
    sum += v[j];
  }
  sum = WarpAllReduce(sum, SumOp());
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  T* yr = y + row * cols;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) yr[c] = FromF32<T>(v[j] * inv);
  }
}

// One block per row: a pass for the running max and sum of exponentials
// (rescaled when the max grows), a pass writing the probabilities. kVec > 1
// (16 bytes of T) needs cols % kVec == 0 and 16-byte aligned rows.
template <int kVec, typename T>
__global__ void SoftmaxBlockKernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols, float scale,
                                   Visibility vis) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
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
  T* yr = y + row * cols;
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

template <int kPerLane, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    SoftmaxGradWarpKernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                          int64_t cols, float scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const T* yr = y + row * cols;
  const T* gr = dy + row * cols;
  float yv[kPerLane], gv[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    yv[j] = c < cols ? ToF32(yr[c]) : 0.0f;
    gv[j] = c < cols ? ToF32(gr[c]) : 0.0f;
  }
  double dot = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) dot += static_cast<double>(yv[j]) * gv[j];
  const float d = static_cast<float>(WarpAllReduce(dot, SumOp()));
  T* out = dx + row * cols;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) out[c] = FromF32<T>(scale * yv[j] * (gv[j] - d));
  }
}

template <int kVec, typename T>
__global__ void SoftmaxGradBlockKernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                       int64_t cols, float scale) {
  const int64_t row = blockIdx.x;
  const T* yr = y + row * cols;
  const T* gr = dy + row * cols;
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
  T* out = dx + row * cols;
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

// Calls f(std::type_identity<T>()) with T the device type of `dtype`, one
// of f32, bf16 and f16 (CheckFloating has checked it).
template <typename F>
void DispatchFloating(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBFloat16:
      return f(std::type_identity<__nv_bfloat16>());
    case DType::kFloat16:
      return f(std::type_identity<__half>());
    default:
      return f(std::type_identity<float>());
  }
}

void CheckFloating(const char* op, const char* what, const Tensor& t) {
  const DType d = t.dtype();
  TESSEL_CHECK(d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16)
      << op << " on CUDA supports f32, bf16 and f16 tensors; got " << what << " of " << d << " " << t.shape();
}

// The block kernels' vector width: 16 bytes of T when every row starts
// 16-byte aligned, else one element.
template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));

}  // namespace

Tensor Softmax(const Tensor& x, const SoftmaxOptions& options) {
  TESSEL_CHECK(x.ndim() >= 1) << "softmax needs a tensor of rank >= 1; got " << x.shape();
  CheckFloating("softmax", "x", x);
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
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return out;
  CheckRows(rows);
  Visibility vis;
  vis.causal = options.causal;
  vis.q = q;
  vis.queries = options.queries > 0 ? options.queries : q;
  vis.query_offset = options.query_offset;
  TESSEL_CHECK(vis.query_offset >= 0 && vis.query_offset + q <= vis.queries)
      << "causal softmax: query rows [" << vis.query_offset << ", " << vis.query_offset + q
      << ") are not inside the " << vis.queries << " queries";
  if (masked) {
    vis.mask = static_cast<const bool*>(options.mask.raw_data());
    vis.mask_index = BroadcastIndexer(options.mask.shape(), x.shape());
    vis.mask_step = vis.mask_index.strides[vis.mask_index.ndim - 1];
  }
  const cudaStream_t stream = CurrentStream();
  DispatchFloating(x.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = kVecOf<T>;
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(out.raw_data());
    if (cols <= kMaxWarpCols) {
      WithPerLane(cols, [&](auto per_lane) {
        SoftmaxWarpKernel<decltype(per_lane)::value, T>
            <<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(px, py, rows, cols, options.scale, vis);
      });
    } else if (cols % kVec == 0 && Aligned16(px) && Aligned16(py)) {
      SoftmaxBlockKernel<kVec, T>
          <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(px, py, cols, options.scale, vis);
    } else {
      SoftmaxBlockKernel<1, T>
          <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(px, py, cols, options.scale, vis);
    }
  });
  CheckLaunch("softmax kernel");
  return out;
}

Tensor SoftmaxGrad(const Tensor& y, const Tensor& dy, float scale) {
  TESSEL_CHECK(y.shape() == dy.shape())
      << "softmax gradient of shape " << dy.shape() << " for output " << y.shape();
  TESSEL_CHECK(y.ndim() >= 1) << "softmax gradient needs tensors of rank >= 1; got " << y.shape();
  CheckFloating("softmax_grad", "y", y);
  TESSEL_CHECK(dy.dtype() == y.dtype())
      << "softmax_grad: y is " << y.dtype() << " but dy is " << dy.dtype() << "; cast one (fn::cast)";
  CheckOnDevice("softmax_grad", y.device(), {y, dy});
  SetDevice(y.device());
  const int64_t cols = y.shape()[-1], rows = cols == 0 ? 0 : y.numel() / cols;
  Tensor out = Tensor::Empty(y.shape(), y.dtype(), y.device());
  if (rows == 0) return out;
  CheckRows(rows);
  const cudaStream_t stream = CurrentStream();
  DispatchFloating(y.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = kVecOf<T>;
    const T* py = static_cast<const T*>(y.raw_data());
    const T* pg = static_cast<const T*>(dy.raw_data());
    T* pd = static_cast<T*>(out.raw_data());
    if (cols <= kMaxWarpCols) {
      WithPerLane(cols, [&](auto per_lane) {
        SoftmaxGradWarpKernel<decltype(per_lane)::value, T>
            <<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(py, pg, pd, rows, cols, scale);
      });
    } else if (cols % kVec == 0 && Aligned16(py) && Aligned16(pg) && Aligned16(pd)) {
      SoftmaxGradBlockKernel<kVec, T>
          <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(py, pg, pd, cols, scale);
    } else {
      SoftmaxGradBlockKernel<1, T>
          <<<static_cast<unsigned>(rows), BlockThreads(cols), 0, stream>>>(py, pg, pd, cols, scale);
    }
  });
  CheckLaunch("softmax_grad kernel");
  return out;
}

}  // namespace tessel::cuda
