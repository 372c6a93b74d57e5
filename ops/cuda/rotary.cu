#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/rotary.h"

namespace tessel::cuda {
namespace {

// The frequencies travel as a kernel argument (1 KiB): no copy to the
// device, no host synchronisation.
struct Frequencies {
  float v[kMaxRotaryFrequencies];
};

// One thread per (row, head, j < d/2) pair of features.
template <typename T>
__global__ void RotaryKernel(const T* __restrict__ x, const int64_t* __restrict__ positions,
                             T* __restrict__ y, Frequencies freq, int64_t pairs, int64_t s, int64_t n,
                             int64_t half, bool per_row, float sign) {
  TESSEL_CUDA_GRID_LOOP(i, pairs) {
    const int64_t j = i % half;
    const int64_t head_row = i / half;  // (row, head)
    const int64_t row = head_row / n;
    const float p = static_cast<float>(positions[per_row ? row : row % s]);
    float sn, c;
    sincosf(freq.v[j] * p, &sn, &c);
    sn *= sign;
    const int64_t base = head_row * 2 * half;
    const float x1 = ToF32(x[base + j]), x2 = ToF32(x[base + j + half]);
    y[base + j] = FromF32<T>(x1 * c - x2 * sn);
    y[base + j + half] = FromF32<T>(x2 * c + x1 * sn);
  }
}

}  // namespace

Tensor Rotary(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse) {
  TESSEL_CHECK(x.ndim() == 4) << "rotary needs x [batch, seq, heads, head_dim]; got " << x.shape();
  const int64_t s = x.shape()[1], n = x.shape()[2], half = x.shape()[3] / 2;
  TESSEL_CHECK(static_cast<int64_t>(inv_freq.size()) == half && half <= kMaxRotaryFrequencies)
      << "rotary on CUDA takes head_dim up to " << 2 * kMaxRotaryFrequencies << "; got " << x.shape()[3]
      << " with " << inv_freq.size() << " frequencies";
  CheckOnDevice("rotary", x.device(), {x, positions});
  SetDevice(x.device());
  Tensor y = Tensor::Empty(x.shape(), x.dtype(), x.device());
  const int64_t pairs = x.numel() / 2;
  if (pairs == 0) return y;
  Frequencies freq{};
  for (int64_t j = 0; j < half; ++j) freq.v[j] = inv_freq[j];
  VisitFloat("rotary", x.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    RotaryKernel<T><<<Blocks(pairs), kThreads, 0, CurrentStream()>>>(
        static_cast<const T*>(x.raw_data()), static_cast<const int64_t*>(positions.raw_data()),
        static_cast<T*>(y.raw_data()), freq, pairs, s, n, half, positions.ndim() == 2,
        inverse ? -1.0f : 1.0f);
  });
  CheckLaunch("rotary kernel");
  return y;
}

}  // namespace tessel::cuda
