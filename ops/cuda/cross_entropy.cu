#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/row_util.cuh"

namespace tessel::cuda {
namespace {

// Rows of up to kMaxWarpCols classes take one warp each, held in registers
// (read once); longer rows (a vocabulary) take a block each: one pass for
// the running max and sum of exponentials, and for the gradient a second
// pass writing it.
constexpr int kRowWarps = 4;  // rows per block on the warp path
constexpr int64_t kMaxWarpCols = 1024;
constexpr int kMeanThreads = 1024;

__device__ __forceinline__ bool InRange(int64_t label, int64_t cols) { return label >= 0 && label < cols; }

// Adds a to the running max m and sum s of exp(. - m) of one thread.
__device__ __forceinline__ void Online(float a, float& m, double& s) {
  if (a > m) {
    s = s * expf(m - a) + 1.0;
    m = a;
  } else if (a != -INFINITY) {  // -inf adds nothing (and a NaN poisons the sum, as on the CPU)
    s += expf(a - m);
  }
}

// The row's max and sum of exp(z - max) from each thread's running pair.
__device__ __forceinline__ void BlockMaxSum(float m, double s, float& mx, double& sum) {
  mx = BlockAllReduce(m, -INFINITY, MaxOp());
  sum = BlockAllReduce(s == 0.0 ? 0.0 : s * expf(m - mx), 0.0, SumOp());
}

// Lane l holds classes l, l + 32, ...: each load is one coalesced line.
// Loads the row, returns its max and sum of exp(z - max).
template <int kPerLane, typename T>
__device__ __forceinline__ void WarpRowStats(const T* zr, int64_t cols, int lane, float (&v)[kPerLane],
                                             float& mx, double& sum) {
  mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = c < cols ? ToF32(zr[c]) : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  mx = WarpAllReduce(mx, MaxOp());
  double s = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) s += expf(v[j] - mx);
  }
  sum = WarpAllReduce(s, SumOp());
}

__device__ __forceinline__ float RowLoss(float mx, double sum, float label_logit) {
  return static_cast<float>(static_cast<double>(mx) + log(sum) - label_logit);
}

template <int kPerLane, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    CrossEntropyWarpKernel(const T* __restrict__ z, const int64_t* __restrict__ labels,
                           float* __restrict__ loss, int64_t rows, int64_t cols, int64_t ignore_index) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t label = labels[row];
  if (label == ignore_index) {
    if (lane == 0) loss[row] = 0.0f;
    return;
  }
  const T* zr = z + row * cols;
  float v[kPerLane];
  float mx;
  double sum;
  WarpRowStats<kPerLane>(zr, cols, lane, v, mx, sum);
  if (lane == 0) loss[row] = InRange(label, cols) ? RowLoss(mx, sum, ToF32(zr[label])) : NAN;
}

template <int kVec, typename T>
__global__ void CrossEntropyBlockKernel(const T* __restrict__ z, const int64_t* __restrict__ labels,
                                        float* __restrict__ loss, int64_t cols, int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t label = labels[row];
  if (label == ignore_index) {  // the whole block leaves: no barrier is left waiting
    if (threadIdx.x == 0) loss[row] = 0.0f;
    return;
  }
  const T* zr = z + row * cols;
  float m = -INFINITY;
  double s = 0;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols;
       i += static_cast<int64_t>(blockDim.x) * kVec) {
    float v[kVec];
    Load<kVec>(zr + i, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) Online(v[e], m, s);
  }
  float mx;
  double sum;
  BlockMaxSum(m, s, mx, sum);
  if (threadIdx.x == 0) loss[row] = InRange(label, cols) ? RowLoss(mx, sum, ToF32(zr[label])) : NAN;
}

// dz = softmax(z) * g - onehot(label) * g, in that order as on the CPU.
__device__ __forceinline__ float GradAt(float zv, float mx, float inv, float g, int64_t c, int64_t label) {
  float d = expf(zv - mx) * inv * g;
  if (c == label) d -= g;
  return d;
}

template <int kPerLane, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    CrossEntropyGradWarpKernel(const T* __restrict__ z, const int64_t* __restrict__ labels,
                               const float* __restrict__ dloss, T* __restrict__ dz, int64_t rows,
                               int64_t cols, int64_t ignore_index) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t label = labels[row];
  T* out = dz + row * cols;
  if (label == ignore_index) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t c = lane + 32 * j;
      if (c < cols) out[c] = FromF32<T>(0.0f);
    }
    return;
  }
  float v[kPerLane];
  float mx;
  double sum;
  WarpRowStats<kPerLane>(z + row * cols, cols, lane, v, mx, sum);
  const float g = InRange(label, cols) ? dloss[row] : NAN;
  const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < cols) out[c] = FromF32<T>(GradAt(v[j], mx, inv, g, c, label));
  }
}

template <int kVec, typename T>
__global__ void CrossEntropyGradBlockKernel(const T* __restrict__ z, const int64_t* __restrict__ labels,
                                            const float* __restrict__ dloss, T* __restrict__ dz, int64_t cols,
                                            int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const int64_t label = labels[row];
  T* out = dz + row * cols;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  if (label == ignore_index) {
    float zeros[kVec] = {};
    for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols; i += stride)
      Store<kVec>(out + i, zeros);
    return;
  }
  const T* zr = z + row * cols;
  float m = -INFINITY;
  double s = 0;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols; i += stride) {
    float v[kVec];
    Load<kVec>(zr + i, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) Online(v[e], m, s);
  }
  float mx;
  double sum;
  BlockMaxSum(m, s, mx, sum);
  const float g = InRange(label, cols) ? dloss[row] : NAN;
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * kVec; i < cols; i += stride) {
    float v[kVec];
    Load<kVec>(zr + i, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = GradAt(v[e], mx, inv, g, i + e, label);
    Store<kVec>(out + i, v);
  }
}

// One block: the rows' sum (in double, as the CPU) over the count.
__global__ void __launch_bounds__(kMeanThreads)
    MaskedMeanKernel(const float* __restrict__ rows, int64_t n_rows, const int64_t* __restrict__ labels,
                     int64_t n_labels, int64_t ignore_index, float* __restrict__ out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n_rows; i += blockDim.x) s += rows[i];
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n_labels; i += blockDim.x) count += labels[i] != ignore_index;
  s = BlockAllReduce(s, 0.0, SumOp());
  count = BlockAllReduce(count, 0LL, SumOp());
  if (threadIdx.x == 0) *out = count > 0 ? static_cast<float>(s / static_cast<double>(count)) : 0.0f;
}

// One block: counts the labels, then writes every row's share.
__global__ void __launch_bounds__(kMeanThreads)
    MaskedMeanGradKernel(const float* __restrict__ dy, const int64_t* __restrict__ labels, int64_t n,
                         int64_t ignore_index, float* __restrict__ out) {
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) count += labels[i] != ignore_index;
  count = BlockAllReduce(count, 0LL, SumOp());
  const float g = *dy;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = labels[i] == ignore_index ? 0.0f : g / static_cast<float>(count);
}

// Calls f(std::integral_constant<int, P>) with P the power of two of
// classes per lane that covers `cols` (<= kMaxWarpCols).
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

// Calls f(std::type_identity<T>()) with T the device type of `dtype`, one
// of f32, bf16 and f16 (CheckInputs has checked it).
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

// The block kernels' vector width: 16 bytes of T when every row starts
// 16-byte aligned, else one element.
template <typename T>
constexpr int kVecOf = 16 / static_cast<int>(sizeof(T));

// The CPU's shape and dtype checks (logits may also be bf16 or f16 here);
// the label range check is the kernels' NaN (see the header).
void CheckInputs(const char* op, const Tensor& logits, const Tensor& labels) {
  const DType t = logits.dtype();
  TESSEL_CHECK((t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16) && logits.ndim() == 2)
      << op << " needs f32, bf16 or f16 logits [N, C]; got " << t << " " << logits.shape();
  TESSEL_CHECK(labels.dtype() == DType::kInt64 && labels.shape() == Shape{logits.shape()[0]})
      << op << " needs i64 labels [" << logits.shape()[0] << "]; got " << labels.dtype() << " "
      << labels.shape();
  TESSEL_CHECK(logits.shape()[0] <= 0x7fffffffLL)
      << op << " on CUDA takes at most 2^31 - 1 rows; got " << logits.shape()[0];
}

}  // namespace

Tensor SparseCrossEntropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  CheckInputs("cross_entropy", logits, labels);
  CheckOnDevice("cross_entropy", logits.device(), {logits, labels});
  SetDevice(logits.device());
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  Tensor loss = Tensor::Empty({n}, DType::kFloat32, logits.device());  // f32 whatever the logits
  if (n == 0) return loss;
  const int64_t* y = static_cast<const int64_t*>(labels.raw_data());
  float* out = static_cast<float*>(loss.raw_data());
  const cudaStream_t stream = CurrentStream();
  DispatchFloating(logits.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = kVecOf<T>;
    const T* z = static_cast<const T*>(logits.raw_data());
    if (c <= kMaxWarpCols) {
      WithPerLane(c, [&](auto per_lane) {
        CrossEntropyWarpKernel<decltype(per_lane)::value, T>
            <<<WarpBlocks(n), kRowWarps * 32, 0, stream>>>(z, y, out, n, c, ignore_index);
      });
    } else if (c % kVec == 0 && Aligned16(z)) {
      CrossEntropyBlockKernel<kVec, T>
          <<<static_cast<unsigned>(n), BlockThreads(c), 0, stream>>>(z, y, out, c, ignore_index);
    } else {
      CrossEntropyBlockKernel<1, T>
          <<<static_cast<unsigned>(n), BlockThreads(c), 0, stream>>>(z, y, out, c, ignore_index);
    }
  });
  CheckLaunch("cross_entropy kernel");
  return loss;
}

Tensor SparseCrossEntropyGrad(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                              int64_t ignore_index) {
  CheckInputs("cross_entropy_grad", logits, labels);
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  TESSEL_CHECK(dloss.shape() == Shape{n} && dloss.dtype() == DType::kFloat32)
      << "cross_entropy gradient of shape " << dloss.shape() << " (" << dloss.dtype() << "); expected f32 ["
      << n << "] (the loss is f32 whatever the logits)";
  CheckOnDevice("cross_entropy_grad", logits.device(), {logits, labels, dloss});
  SetDevice(logits.device());
  Tensor dz = Tensor::Empty(logits.shape(), logits.dtype(), logits.device());
  if (dz.numel() == 0) return dz;
  const int64_t* y = static_cast<const int64_t*>(labels.raw_data());
  const float* g = static_cast<const float*>(dloss.raw_data());
  const cudaStream_t stream = CurrentStream();
  DispatchFloating(logits.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = kVecOf<T>;
    const T* z = static_cast<const T*>(logits.raw_data());
    T* out = static_cast<T*>(dz.raw_data());
    if (c <= kMaxWarpCols) {
      WithPerLane(c, [&](auto per_lane) {
        CrossEntropyGradWarpKernel<decltype(per_lane)::value, T>
            <<<WarpBlocks(n), kRowWarps * 32, 0, stream>>>(z, y, g, out, n, c, ignore_index);
      });
    } else if (c % kVec == 0 && Aligned16(z) && Aligned16(out)) {
      CrossEntropyGradBlockKernel<kVec, T>
          <<<static_cast<unsigned>(n), BlockThreads(c), 0, stream>>>(z, y, g, out, c, ignore_index);
    } else {
      CrossEntropyGradBlockKernel<1, T>
          <<<static_cast<unsigned>(n), BlockThreads(c), 0, stream>>>(z, y, g, out, c, ignore_index);
    }
  });
  CheckLaunch("cross_entropy_grad kernel");
  return dz;
}

Tensor MaskedMean(const Tensor& rows, const Tensor& labels, int64_t ignore_index) {
  TESSEL_CHECK(rows.dtype() == DType::kFloat32 && labels.dtype() == DType::kInt64)
      << "masked_mean needs f32 rows and i64 labels; got " << rows.dtype() << " and " << labels.dtype();
  CheckOnDevice("masked_mean", rows.device(), {rows, labels});
  SetDevice(rows.device());
  Tensor out = Tensor::Empty(Shape{}, DType::kFloat32, rows.device());
  MaskedMeanKernel<<<1, kMeanThreads, 0, CurrentStream()>>>(
      static_cast<const float*>(rows.raw_data()), rows.numel(),
      static_cast<const int64_t*>(labels.raw_data()), labels.numel(), ignore_index,
      static_cast<float*>(out.raw_data()));
  CheckLaunch("masked_mean kernel");
  return out;
}

Tensor MaskedMeanGrad(const Tensor& dy, const Tensor& labels, int64_t ignore_index) {
  TESSEL_CHECK(dy.dtype() == DType::kFloat32 && dy.numel() == 1 && labels.dtype() == DType::kInt64)
      << "masked_mean gradient needs a one-element f32 dy and i64 labels; got " << dy.dtype() << " "
      << dy.shape() << " and " << labels.dtype();
  CheckOnDevice("masked_mean_grad", labels.device(), {dy, labels});
  SetDevice(labels.device());
  Tensor out = Tensor::Empty(labels.shape(), DType::kFloat32, labels.device());
  if (out.numel() == 0) return out;
  MaskedMeanGradKernel<<<1, kMeanThreads, 0, CurrentStream()>>>(
      static_cast<const float*>(dy.raw_data()), static_cast<const int64_t*>(labels.raw_data()),
      labels.numel(), ignore_index, static_cast<float*>(out.raw_data()));
  CheckLaunch("masked_mean_grad kernel");
  return out;
}

}  // namespace tessel::cuda
