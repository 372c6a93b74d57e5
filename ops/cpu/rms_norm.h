// Root-mean-square normalization over the last dimension (Llama's RMSNorm):
// y = x / sqrt(mean(x^2) + eps) * weight, and its gradient.
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

// x [..., d] and weight [d], f32.
Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps);

struct RmsNormGrads {
  Tensor dx, dweight;
};
// The row statistics are recomputed from x (one sum per row, cheaper than
// keeping them between forward and backward).
RmsNormGrads RmsNormGrad(const Tensor& dy, const Tensor& x, const Tensor& weight, float eps);

}  // namespace tessel::cpu
