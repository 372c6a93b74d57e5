#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/rms_norm.h"
#include "ops/cuda/row_util.cuh"
#include "ops/cuda/where_cast.h"

namespace tessel::cuda {
namespace {

constexpr int kRowThreads = 256;
// The weight gradient's column sums: each block sums a chunk of rows for
// kColThreads columns and adds its sums to an f32 total.
constexpr int kColThreads = 256;
constexpr int64_t kRowsPerChunk = 64;

template <typename T>
__device__ float RowRstd(const T* xr, int64_t d, float eps) {
  float s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    const float v = ToF32(xr[c]);
    s2 += v * v;
  }
  return rsqrtf(BlockAllReduce(s2, 0.0f, SumOp{}) / static_cast<float>(d) + eps);
}

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int64_t d,
                              float eps) {
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * d;
  T* yr = y + static_cast<int64_t>(blockIdx.x) * d;
  const float rstd = RowRstd(xr, d, eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    yr[c] = FromF32<T>(ToF32(w[c]) * (ToF32(xr[c]) * rstd));
}

// dx = rstd (dy w) - x rstd^3 mean(dy w x); the row's rstd is kept for the
// weight gradient.
template <typename T>
__global__ void RmsNormGradKernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                                  T* __restrict__ dx, float* __restrict__ rstd_out, int64_t d, float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* gr = dy + row * d;
  const float rstd = RowRstd(xr, d, eps);
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dot += ToF32(gr[c]) * ToF32(w[c]) * ToF32(xr[c]);
  dot = BlockAllReduce(dot, 0.0f, SumOp{});
  const float k = rstd * rstd * rstd * dot / static_cast<float>(d);
  T* dxr = dx + row * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
    dxr[c] = FromF32<T>(rstd * ToF32(gr[c]) * ToF32(w[c]) - ToF32(xr[c]) * k);
  if (threadIdx.x == 0) rstd_out[row] = rstd;
}

template <typename T>
__global__ void RmsNormWeightGradKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                        const float* __restrict__ rstd, float* __restrict__ dw, int64_t rows,
                                        int64_t d) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t end = begin + kRowsPerChunk < rows ? begin + kRowsPerChunk : rows;
  float s = 0.0f;
  for (int64_t r = begin; r < end; ++r) s += ToF32(dy[r * d + c]) * ToF32(x[r * d + c]) * rstd[r];
  atomicAdd(dw + c, s);
}

void CheckArgs(const char* op, const Tensor& x, const Tensor& weight) {
  TESSEL_CHECK(x.ndim() >= 1) << op << " needs a tensor of rank >= 1; got " << x.shape();
  TESSEL_CHECK(weight.dtype() == x.dtype() && weight.shape() == Shape{x.shape()[-1]})
      << op << ": weight " << weight.dtype() << " " << weight.shape() << " for x " << x.dtype() << " "
      << x.shape() << "; expected " << x.dtype() << " [" << x.shape()[-1] << "]";
  TESSEL_CHECK(x.numel() / (x.shape()[-1] ? x.shape()[-1] : 1) < (int64_t{1} << 31))
      << op << ": " << x.shape() << " has more rows than one launch takes (2^31)";
}

}  // namespace

Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps) {
  CheckArgs("rms_norm", x, weight);
  CheckOnDevice("rms_norm", x.device(), {x, weight});
  SetDevice(x.device());
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  if (rows == 0) return y;
  VisitFloat("rms_norm", x.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    RmsNormKernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, CurrentStream()>>>(
        static_cast<const T*>(x.raw_data()), static_cast<const T*>(weight.raw_data()),
        static_cast<T*>(y.raw_data()), d, eps);
  });
  CheckLaunch("rms_norm kernel");
  return y;
}

RmsNormGrads RmsNormGrad(const Tensor& dy, const Tensor& x, const Tensor& weight, float eps) {
  CheckArgs("rms_norm_grad", x, weight);
  TESSEL_CHECK(dy.dtype() == x.dtype() && dy.shape() == x.shape())
      << "rms_norm_grad: dy " << dy.dtype() << " " << dy.shape() << " for x " << x.dtype() << " "
      << x.shape();
  CheckOnDevice("rms_norm_grad", x.device(), {dy, x, weight});
  SetDevice(x.device());
  const Device device = x.device();
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  Tensor dx = Tensor::Empty(x.shape(), x.dtype(), device);
  Tensor rstd = Tensor::Empty({rows}, DType::kFloat32, device);
  Tensor dw = Tensor::Empty({d}, DType::kFloat32, device);
  Zero(dw);
  if (rows > 0) {
    VisitFloat("rms_norm_grad", x.dtype(), [&](auto type) {
      using T = typename decltype(type)::type;
      const T* pdy = static_cast<const T*>(dy.raw_data());
      const T* px = static_cast<const T*>(x.raw_data());
      RmsNormGradKernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, CurrentStream()>>>(
          pdy, px, static_cast<const T*>(weight.raw_data()), static_cast<T*>(dx.raw_data()),
          static_cast<float*>(rstd.raw_data()), d, eps);
      CheckLaunch("rms_norm_grad kernel");
      const dim3 grid(static_cast<unsigned>((d + kColThreads - 1) / kColThreads),
                      static_cast<unsigned>((rows + kRowsPerChunk - 1) / kRowsPerChunk));
      RmsNormWeightGradKernel<T><<<grid, kColThreads, 0, CurrentStream()>>>(
          pdy, px, static_cast<const float*>(rstd.raw_data()), static_cast<float*>(dw.raw_data()), rows, d);
      CheckLaunch("rms_norm weight gradient kernel");
    });
  }
  return {dx, x.dtype() == DType::kFloat32 ? dw : Cast(dw, x.dtype())};
}

}  // namespace tessel::cuda
