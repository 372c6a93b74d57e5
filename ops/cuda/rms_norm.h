// RMSNorm over the last dimension on CUDA devices, and its gradient: the
// CPU's semantics (ops/cpu/rms_norm.h) for f32, bf16 and f16 (x, dy and
// weight share a dtype, which y, dx and dweight take; the arithmetic is f32).
#pragma once

#include "core/tensor.h"

namespace tessel::cuda {

Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps);

struct RmsNormGrads {
  Tensor dx, dweight;
};
RmsNormGrads RmsNormGrad(const Tensor& dy, const Tensor& x, const Tensor& weight, float eps);

}  // namespace tessel::cuda
