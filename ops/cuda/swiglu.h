// The SiLU-gated product on CUDA devices: the CPU's semantics
// (ops/cpu/swiglu.h) for f32, bf16 and f16 (computed in f32).
#pragma once

#include "core/tensor.h"

namespace tessel::cuda {

Tensor Swiglu(const Tensor& gate, const Tensor& up);

struct SwigluGrads {
  Tensor dgate, dup;
};
SwigluGrads SwigluGrad(const Tensor& dy, const Tensor& gate, const Tensor& up);

}  // namespace tessel::cuda
