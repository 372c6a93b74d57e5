#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/layer_norm.h"
#include "ops/cuda/row_util.cuh"

namespace tessel::cuda {
namespace {

// Rows up to kMaxWarpCols long take one warp each, held in registers (read
// once); longer rows take a block each and are read again per pass (mostly
// from the cache).
constexpr int kRowWarps = 4;  // rows per block on the warp path
constexpr int64_t kMaxWarpCols = 1024;
// The parameter gradients are column sums: blocks of kColTile columns by
// kColRows rows of threads, each block summing one chunk of rows.
constexpr int kColTile = 32;
constexpr int kColRows = 8;

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Every thread of the block gets the sum.
template <typename T>
__device__ T BlockSum(T v) {
  __shared__ T scratch[32];
  v = WarpSum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpSum(lane < warps ? scratch[lane] : T(0));
}

__device__ __forceinline__ float Rstd(float sum_sq, int64_t d, float eps) {
  return 1.0f / sqrtf(sum_sq / static_cast<float>(d) + eps);
}

// Register j of a lane holds column Col<kVec>(lane, j): each lane takes
// kVec adjacent columns per load (one 16-byte vector when kVec > 1), the
// lanes side by side, so each load of the warp is whole lines.
template <int kVec>
__device__ __forceinline__ int64_t Col(int lane, int j) {
  return kVec * (lane + 32 * (j / kVec)) + j % kVec;
}

// v[j] = row[Col(lane, j)], zeros past d (d % kVec == 0).
template <int kPerLane, int kVec, typename T>
__device__ __forceinline__ void LoadRow(const T* row, int lane, int64_t d, float (&v)[kPerLane]) {
#pragma unroll
  for (int j = 0; j < kPerLane; j += kVec) {
    float t[kVec];
    const int64_t c = Col<kVec>(lane, j);
    if (c < d) {
      Load<kVec>(row + c, t);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) t[e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[j + e] = t[e];
  }
}

template <int kPerLane, int kVec, typename T>
__device__ __forceinline__ void StoreRow(T* row, int lane, int64_t d, const float (&v)[kPerLane]) {
#pragma unroll
  for (int j = 0; j < kPerLane; j += kVec) {
    const int64_t c = Col<kVec>(lane, j);
    if (c >= d) continue;
    float t[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) t[e] = v[j + e];
    Store<kVec>(row + c, t);
  }
}

// A warp per row, the row in registers (read once).
template <int kPerLane, int kVec, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    LayerNormWarpKernel(const T* __restrict__ x, const T* __restrict__ gamma, const T* __restrict__ beta,
                        T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                        int64_t d, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float v[kPerLane];
  LoadRow<kPerLane, kVec>(x + row * d, lane, d, v);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) s += v[j];
  const float mu = WarpSum(s) / static_cast<float>(d);
  float s2 = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const float t = v[j] - mu;
    if (Col<kVec>(lane, j) < d) s2 += t * t;
  }
  const float rs = Rstd(WarpSum(s2), d, eps);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  float g[kPerLane], b[kPerLane];
  if (gamma) {
    LoadRow<kPerLane, kVec>(gamma, lane, d, g);
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) g[j] = 1.0f;
  }
  if (beta) {
    LoadRow<kPerLane, kVec>(beta, lane, d, b);
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) b[j] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = (v[j] - mu) * rs * g[j] + b[j];
  StoreRow<kPerLane, kVec>(y + row * d, lane, d, v);
}

template <typename T>
__global__ void LayerNormBlockKernel(const T* __restrict__ x, const T* __restrict__ gamma,
                                     const T* __restrict__ beta, T* __restrict__ y, float* __restrict__ mean,
                                     float* __restrict__ rstd, int64_t d, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) s += ToF32(xr[c]);
  const float mu = BlockSum(s) / static_cast<float>(d);
  float s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float t = ToF32(xr[c]) - mu;
    s2 += t * t;
  }
  const float rs = Rstd(BlockSum(s2), d, eps);
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
  T* yr = y + row * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    yr[c] = FromF32<T>((ToF32(xr[c]) - mu) * rs * (gamma ? ToF32(gamma[c]) : 1.0f) +
                       (beta ? ToF32(beta[c]) : 0.0f));
}

// dx = rstd/d * (d*dxhat - sum(dxhat) - xhat*sum(dxhat*xhat)), dxhat =
// dy * gamma, in double like the CPU. With kRecompute the row's mean and
// rstd are computed here from x and written to mean_out / rstd_out (the
// parameter gradients read them); else they are read from mean_in /
// rstd_in.
template <int kPerLane, int kVec, bool kRecompute, typename T>
__global__ void __launch_bounds__(kRowWarps * 32)
    LayerNormGradWarpKernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gamma,
                            const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                            float* __restrict__ mean_out, float* __restrict__ rstd_out, T* __restrict__ dx,
                            int64_t rows, int64_t d, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float xv[kPerLane], gv[kPerLane];
  LoadRow<kPerLane, kVec>(x + row * d, lane, d, xv);
  LoadRow<kPerLane, kVec>(dy + row * d, lane, d, gv);
  float mu, rs;
  if constexpr (kRecompute) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) s += xv[j];
    mu = WarpSum(s) / static_cast<float>(d);
    float s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const float t = xv[j] - mu;
      if (Col<kVec>(lane, j) < d) s2 += t * t;
    }
    rs = Rstd(WarpSum(s2), d, eps);
    if (lane == 0) {
      mean_out[row] = mu;
      rstd_out[row] = rs;
    }
  } else {
    mu = mean_in[row];
    rs = rstd_in[row];
  }
  if (gamma) {  // gv becomes dxhat = dy * gamma
    float g[kPerLane];
    LoadRow<kPerLane, kVec>(gamma, lane, d, g);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) gv[j] *= g[j];
  }
  double sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (Col<kVec>(lane, j) < d) {
      const double xhat = static_cast<double>(xv[j] - mu) * rs;
      sum_dxhat += gv[j];
      sum_dxhat_xhat += gv[j] * xhat;
    }
  }
  sum_dxhat = WarpSum(sum_dxhat);
  sum_dxhat_xhat = WarpSum(sum_dxhat_xhat);
  const double dd = static_cast<double>(d), scale = static_cast<double>(rs) / dd;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const double xhat = static_cast<double>(xv[j] - mu) * rs;
    xv[j] = static_cast<float>(scale * (dd * gv[j] - sum_dxhat - xhat * sum_dxhat_xhat));
  }
  StoreRow<kPerLane, kVec>(dx + row * d, lane, d, xv);
}

template <bool kRecompute, typename T>
__global__ void LayerNormGradBlockKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         const T* __restrict__ gamma, const float* __restrict__ mean_in,
                                         const float* __restrict__ rstd_in, float* __restrict__ mean_out,
                                         float* __restrict__ rstd_out, T* __restrict__ dx, int64_t d,
                                         float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* gr = dy + row * d;
  float mu, rs;
  if constexpr (kRecompute) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) s += ToF32(xr[c]);
    mu = BlockSum(s) / static_cast<float>(d);
    float s2 = 0.0f;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
      const float t = ToF32(xr[c]) - mu;
      s2 += t * t;
    }
    rs = Rstd(BlockSum(s2), d, eps);
    if (threadIdx.x == 0) {
      mean_out[row] = mu;
      rstd_out[row] = rs;
    }
  } else {
    mu = mean_in[row];
    rs = rstd_in[row];
  }
  double sum_dxhat = 0, sum_dxhat_xhat = 0;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const double xhat = static_cast<double>(ToF32(xr[c]) - mu) * rs;
    const double dxhat = ToF32(gr[c]) * (gamma ? ToF32(gamma[c]) : 1.0f);
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * xhat;
  }
  sum_dxhat = BlockSum(sum_dxhat);
  sum_dxhat_xhat = BlockSum(sum_dxhat_xhat);
  const double dd = static_cast<double>(d), scale = static_cast<double>(rs) / dd;
  T* out = dx + row * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const double xhat = static_cast<double>(ToF32(xr[c]) - mu) * rs;
    const double dxhat = ToF32(gr[c]) * (gamma ? ToF32(gamma[c]) : 1.0f);
    out[c] = FromF32<T>(static_cast<float>(scale * (dd * dxhat - sum_dxhat - xhat * sum_dxhat_xhat)));
  }
}

// Partial dgamma = sum(dy * xhat) and dbeta = sum(dy) over one chunk of rows
// (blockIdx.y) for kColTile columns (blockIdx.x): partial[chunk * d + c].
template <typename T>
__global__ void __launch_bounds__(kColTile* kColRows)
    LayerNormParamGradPartialKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    int64_t rows, int64_t d, int64_t rows_per_chunk,
                                    double* __restrict__ partial_gamma, double* __restrict__ partial_beta) {
  __shared__ double sg[kColRows][kColTile];
  __shared__ double sb[kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  double g_acc = 0, b_acc = 0;
  if (c < d) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float g = ToF32(dy[r * d + c]);
      const double xhat = static_cast<double>(ToF32(x[r * d + c]) - mean[r]) * rstd[r];
      g_acc += g * xhat;
      b_acc += g;
    }
  }
  sg[threadIdx.y][threadIdx.x] = g_acc;
  sb[threadIdx.y][threadIdx.x] = b_acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    for (int k = 1; k < kColRows; ++k) {
      g_acc += sg[k][threadIdx.x];
      b_acc += sb[k][threadIdx.x];
    }
    partial_gamma[blockIdx.y * d + c] = g_acc;
    partial_beta[blockIdx.y * d + c] = b_acc;
  }
}

// Sums the chunks' partials: kColTile columns a block, its kColRows rows of
// threads taking every kColRows-th chunk, then adding up in shared memory.
// (One thread walking all chunks of a column waited on one load after
// another: 22 us for 33 chunks of 1,024 columns.)
template <typename T>
__global__ void __launch_bounds__(kColTile* kColRows)
    LayerNormParamGradFinalKernel(const double* __restrict__ partial_gamma,
                                  const double* __restrict__ partial_beta, int64_t chunks, int64_t d,
                                  T* __restrict__ dgamma, T* __restrict__ dbeta) {
  __shared__ double sg[kColRows][kColTile];
  __shared__ double sb[kColRows][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  double g = 0, b = 0;
  if (c < d) {
    for (int64_t k = threadIdx.y; k < chunks; k += kColRows) {
      g += partial_gamma[k * d + c];
      b += partial_beta[k * d + c];
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    for (int k = 1; k < kColRows; ++k) {
      g += sg[k][threadIdx.x];
      b += sb[k][threadIdx.x];
    }
    dgamma[c] = FromF32<T>(static_cast<float>(g));
    dbeta[c] = FromF32<T>(static_cast<float>(b));
  }
}

// Calls f(std::integral_constant<int, P>) with P the columns per lane that
// cover `d` (<= kMaxWarpCols): 1, 2, 4, then multiples of 4, so common
// sizes (768 = 32 x 24) hold no idle registers and keep more warps resident.
template <typename F>
void WithPerLane(int64_t d, F&& f) {
  switch ((d + 31) / 32) {
    case 0:
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    case 3:
    case 4:
      return f(std::integral_constant<int, 4>());
    case 5:
    case 6:
    case 7:
    case 8:
      return f(std::integral_constant<int, 8>());
    case 9:
    case 10:
    case 11:
    case 12:
      return f(std::integral_constant<int, 12>());
    case 13:
    case 14:
    case 15:
    case 16:
      return f(std::integral_constant<int, 16>());
    case 17:
    case 18:
    case 19:
    case 20:
      return f(std::integral_constant<int, 20>());
    case 21:
    case 22:
    case 23:
    case 24:
      return f(std::integral_constant<int, 24>());
    case 25:
    case 26:
    case 27:
    case 28:
      return f(std::integral_constant<int, 28>());
    default:
      return f(std::integral_constant<int, 32>());
  }
}

// Whether rows of d elements move as 16-byte vectors: d a multiple of a
// vector and every pointer (null: absent) 16-byte aligned.
template <typename T>
bool Vectorizable(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % (16 / static_cast<int64_t>(sizeof(T))) != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls f(std::integral_constant<int, V>) with V the elements per load: a
// 16-byte vector where `vec` and the columns per lane hold whole vectors, else 1.
template <typename T, int kPerLane, typename F>
void WithVec(bool vec, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  if constexpr (kPerLane % kVec == 0) {
    if (vec) return f(std::integral_constant<int, kVec>());
  }
  f(std::integral_constant<int, 1>());
}

unsigned WarpBlocks(int64_t rows) { return static_cast<unsigned>((rows + kRowWarps - 1) / kRowWarps); }

int BlockThreads(int64_t d) { return d <= 4096 ? 256 : d <= 16384 ? 512 : 1024; }

int SmCount(int device) {
  static std::atomic<int> counts[64] = {};
  if (device < 0 || device >= 64) device = 0;
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    Check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

Shape RowShape(const Shape& x) { return Shape(std::vector<int64_t>(x.dims().begin(), x.dims().end() - 1)); }

template <typename T>
const T* PtrOrNull(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
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

void CheckFloating(const char* op, const Tensor& x) {
  const DType t = x.dtype();
  TESSEL_CHECK(t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16)
      << op << " on CUDA supports f32, bf16 and f16 tensors; got x of " << t << " " << x.shape();
}

void CheckRows(int64_t rows) {
  TESSEL_CHECK(rows <= 0x7fffffffLL) << "layer_norm on CUDA takes at most 2^31 - 1 rows; got " << rows;
}

// gamma and beta (each optional) are [d] of x's dtype.
void CheckParams(const char* op, const Tensor& gamma, const Tensor& beta, int64_t d, DType dtype) {
  for (const Tensor* p : {&gamma, &beta}) {
    if (!p->defined()) continue;
    const char* what = p == &gamma ? "gamma" : "beta";
    TESSEL_CHECK(p->shape() == Shape{d}) << op << ": " << what << " of shape " << p->shape()
                                         << " for normalized size " << d << "; expected [" << d << "]";
    TESSEL_CHECK(p->dtype() == dtype)
        << op << ": x is " << dtype << " but " << what << " is " << p->dtype() << "; cast one (fn::cast)";
  }
}

// The shared gradient: mean/rstd given (defined) or recomputed with eps.
LayerNormGrads Grad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& gamma, float eps) {
  TESSEL_CHECK(dy.shape() == x.shape())
      << "layer_norm gradient of shape " << dy.shape() << " for input " << x.shape();
  TESSEL_CHECK(x.ndim() >= 1) << "layer_norm gradient needs tensors of rank >= 1; got " << x.shape();
  CheckFloating("layer_norm_grad", x);
  const DType dtype = x.dtype();
  TESSEL_CHECK(dy.dtype() == dtype) << "layer_norm_grad: x is " << dtype << " but dy is " << dy.dtype()
                                    << "; cast one (fn::cast)";
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  CheckParams("layer_norm_grad", gamma, Tensor(), d, dtype);
  const bool recompute = !mean.defined();
  if (!recompute) {
    TESSEL_CHECK(mean.numel() == rows && rstd.defined() && rstd.numel() == rows &&
                 mean.dtype() == DType::kFloat32 && rstd.dtype() == DType::kFloat32)
        << "layer_norm gradient needs f32 mean and rstd of " << rows << " rows; got " << mean.ToString()
        << " and " << rstd.ToString();
  }
  CheckOnDevice("layer_norm_grad", x.device(), {dy, x, mean, rstd, gamma});
  SetDevice(x.device());
  const Device device = x.device();
  LayerNormGrads out{Tensor::Empty(x.shape(), dtype, device), Tensor::Empty({d}, dtype, device),
                     Tensor::Empty({d}, dtype, device)};
  if (d == 0) return out;
  CheckRows(rows);
  const cudaStream_t stream = CurrentStream();

  // Row statistics for the parameter gradients: the given ones, or those
  // the row pass writes.
  Tensor stats_mean = mean, stats_rstd = rstd;
  if (recompute) {
    stats_mean = Tensor::Empty({rows}, DType::kFloat32, device);
    stats_rstd = Tensor::Empty({rows}, DType::kFloat32, device);
  }
  const float* mean_in = recompute ? nullptr : static_cast<const float*>(mean.raw_data());
  const float* rstd_in = recompute ? nullptr : static_cast<const float*>(rstd.raw_data());
  float* mean_out = recompute ? static_cast<float*>(stats_mean.raw_data()) : nullptr;
  float* rstd_out = recompute ? static_cast<float*>(stats_rstd.raw_data()) : nullptr;

  // Column sums in two passes, no atomics: enough chunks of rows to fill
  // the GPU, then one thread per column adds its chunks' partials.
  const int64_t col_tiles = (d + kColTile - 1) / kColTile;
  int64_t chunks = 0, rows_per_chunk = 1;
  if (rows > 0) {
    const int64_t target = std::max<int64_t>(1, 8LL * SmCount(device.index()) / col_tiles);
    chunks = std::clamp<int64_t>(target, 1, std::min<int64_t>((rows + 31) / 32, 65535));
    rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  }
  TESSEL_CHECK(col_tiles <= 0x7fffffffLL) << "layer_norm on CUDA: normalized size " << d << " is too large";
  Tensor partial = Tensor::Empty({std::max<int64_t>(1, 2 * chunks * d)}, DType::kInt64, device);  // doubles
  double* partial_gamma = static_cast<double*>(partial.raw_data());
  double* partial_beta = partial_gamma + chunks * d;

  DispatchFloating(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    const T* pdy = static_cast<const T*>(dy.raw_data());
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pgamma = PtrOrNull<T>(gamma);
    T* pdx = static_cast<T*>(out.dx.raw_data());
    if (rows > 0) {
      if (d <= kMaxWarpCols) {
        const bool vec = Vectorizable<T>(d, {pdy, px, pgamma, pdx});
        WithPerLane(d, [&](auto per_lane) {
          constexpr int P = decltype(per_lane)::value;
          WithVec<T, P>(vec, [&](auto vec_width) {
            constexpr int V = decltype(vec_width)::value;
            if (recompute) {
              LayerNormGradWarpKernel<P, V, true, T><<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(
                  pdy, px, pgamma, mean_in, rstd_in, mean_out, rstd_out, pdx, rows, d, eps);
            } else {
              LayerNormGradWarpKernel<P, V, false, T><<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(
                  pdy, px, pgamma, mean_in, rstd_in, mean_out, rstd_out, pdx, rows, d, eps);
            }
          });
        });
      } else if (recompute) {
        LayerNormGradBlockKernel<true, T><<<static_cast<unsigned>(rows), BlockThreads(d), 0, stream>>>(
            pdy, px, pgamma, mean_in, rstd_in, mean_out, rstd_out, pdx, d, eps);
      } else {
        LayerNormGradBlockKernel<false, T><<<static_cast<unsigned>(rows), BlockThreads(d), 0, stream>>>(
            pdy, px, pgamma, mean_in, rstd_in, mean_out, rstd_out, pdx, d, eps);
      }
      CheckLaunch("layer_norm_grad row kernel");
    }
    if (chunks > 0) {
      LayerNormParamGradPartialKernel<T>
          <<<dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(chunks)), dim3(kColTile, kColRows),
             0, stream>>>(pdy, px, static_cast<const float*>(stats_mean.raw_data()),
                          static_cast<const float*>(stats_rstd.raw_data()), rows, d, rows_per_chunk,
                          partial_gamma, partial_beta);
      CheckLaunch("layer_norm_grad parameter kernel");
    }
    LayerNormParamGradFinalKernel<T>
        <<<static_cast<unsigned>(std::max<int64_t>(col_tiles, 1)), dim3(kColTile, kColRows), 0, stream>>>(
            partial_gamma, partial_beta, chunks, d, static_cast<T*>(out.dgamma.raw_data()),
            static_cast<T*>(out.dbeta.raw_data()));
    CheckLaunch("layer_norm_grad parameter sum kernel");
  });
  return out;
}

}  // namespace

LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  TESSEL_CHECK(x.ndim() >= 1) << "layer_norm needs a tensor of rank >= 1; got " << x.shape();
  CheckFloating("layer_norm", x);
  const DType dtype = x.dtype();
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  CheckParams("layer_norm", gamma, beta, d, dtype);
  CheckOnDevice("layer_norm", x.device(), {x, gamma, beta});
  SetDevice(x.device());
  const Device device = x.device();
  LayerNormResult r{Tensor::Empty(x.shape(), dtype, device),
                    Tensor::Empty(RowShape(x.shape()), DType::kFloat32, device),
                    Tensor::Empty(RowShape(x.shape()), DType::kFloat32, device)};
  if (rows == 0) return r;
  CheckRows(rows);
  float* pm = static_cast<float*>(r.mean.raw_data());
  float* pr = static_cast<float*>(r.rstd.raw_data());
  const cudaStream_t stream = CurrentStream();
  DispatchFloating(dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pg = PtrOrNull<T>(gamma);
    const T* pb = PtrOrNull<T>(beta);
    T* py = static_cast<T*>(r.y.raw_data());
    if (d <= kMaxWarpCols) {
      const bool vec = Vectorizable<T>(d, {px, pg, pb, py});
      WithPerLane(d, [&](auto per_lane) {
        constexpr int P = decltype(per_lane)::value;
        WithVec<T, P>(vec, [&](auto vec_width) {
          LayerNormWarpKernel<P, decltype(vec_width)::value, T>
              <<<WarpBlocks(rows), kRowWarps * 32, 0, stream>>>(px, pg, pb, py, pm, pr, rows, d, eps);
        });
      });
    } else {
      LayerNormBlockKernel<T>
          <<<static_cast<unsigned>(rows), BlockThreads(d), 0, stream>>>(px, pg, pb, py, pm, pr, d, eps);
    }
  });
  CheckLaunch("layer_norm kernel");
  return r;
}

LayerNormGrads LayerNormGrad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& gamma) {
  TESSEL_CHECK(mean.defined() && rstd.defined()) << "layer_norm gradient needs the forward's mean and rstd";
  return Grad(dy, x, mean, rstd, gamma, 0.0f);
}

LayerNormGrads LayerNormGrad(const Tensor& dy, const Tensor& x, const Tensor& gamma, float eps) {
  return Grad(dy, x, Tensor(), Tensor(), gamma, eps);
}

}  // namespace tessel::cuda
