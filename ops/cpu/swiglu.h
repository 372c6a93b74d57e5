// The SiLU-gated product of Llama's MLP: y = silu(gate) * up, silu(g) =
// g / (1 + exp(-g)), and its gradient.
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

Tensor Swiglu(const Tensor& gate, const Tensor& up);

struct SwigluGrads {
  Tensor dgate, dup;
};
SwigluGrads SwigluGrad(const Tensor& dy, const Tensor& gate, const Tensor& up);

}  // namespace tessel::cpu
