// Layer normalization over the last dimension on CUDA devices, and its
// gradient. The semantics are the CPU's (ops/cpu/layer_norm.h), for f32,
// bf16 and f16: x, dy, gamma and beta share a dtype, which y, dx, dgamma and
// dbeta take; the arithmetic is f32 (double for the gradient sums) whatever
// it is, and mean and rstd are always f32.
#pragma once

#include "core/tensor.h"

namespace tessel::cuda {

struct LayerNormResult {
  Tensor y;
  Tensor mean;  // per row (shape of x without its last dim)
  Tensor rstd;  // 1 / sqrt(var + eps), biased variance as in PyTorch
};
// gamma and beta are [d] (undefined: 1 and 0).
LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps);

struct LayerNormGrads {
  Tensor dx, dgamma, dbeta;
};
LayerNormGrads LayerNormGrad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& gamma);
// The same with mean and rstd recomputed from x in the gradient's own row
// pass (what layer_norm_grad does; the forward's y is not needed).
LayerNormGrads LayerNormGrad(const Tensor& dy, const Tensor& x, const Tensor& gamma, float eps);

}  // namespace tessel::cuda
