// AdamW's arithmetic for one element, shared by the per-parameter kernel
// (ops/cuda/nn_kernels.cu) and the multi-tensor step (multi_tensor.cu), so
// that both give the CPU's results bit for bit (ops/cpu/nn_kernels.cc):
// operation for operation in double, rounding to float where the CPU
// stores. The _rn intrinsics keep nvcc from fusing a multiply and an add
// that the CPU rounds apart.
#pragma once

#include <cstdint>

namespace tessel::cuda {

// The per-step factors, from the learning rate and the step already counted.
struct AdamWCoef {
  double decay;      // 1 - lr * weight_decay
  double step_size;  // lr / (1 - beta1^step)
  double sqrt_bc2;   // sqrt(1 - beta2^step)
};

__device__ __forceinline__ AdamWCoef MakeAdamWCoef(float lr, int64_t step, double beta1, double beta2,
                                                   double weight_decay) {
  const double l = static_cast<double>(lr), s = static_cast<double>(step);
  return {__dadd_rn(1, -__dmul_rn(l, weight_decay)), l / (1 - pow(beta1, s)), sqrt(1 - pow(beta2, s))};
}

__device__ __forceinline__ void AdamWElement(float& p, float g, float& m, float& v, const AdamWCoef& c,
                                             double beta1, double beta2, double eps) {
  const double gk = g;
  p = static_cast<float>(__dmul_rn(p, c.decay));
  m = static_cast<float>(__dadd_rn(__dmul_rn(beta1, m), __dmul_rn(1 - beta1, gk)));
  v = static_cast<float>(__dadd_rn(__dmul_rn(beta2, v), __dmul_rn(__dmul_rn(1 - beta2, gk), gk)));
  const double denom = __dadd_rn(__ddiv_rn(__fsqrt_rn(v), c.sqrt_bc2), eps);
  p = static_cast<float>(__dadd_rn(p, -__ddiv_rn(__dmul_rn(c.step_size, m), denom)));
}

}  // namespace tessel::cuda
