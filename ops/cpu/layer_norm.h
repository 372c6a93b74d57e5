// Layer normalization over the last dimension.
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

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

}  // namespace tessel::cpu
