// Rotary position embeddings on CUDA devices: the CPU's semantics
// (ops/cpu/rotary.h) for f32, bf16 and f16 (computed in f32), with head_dim
// up to 2 x kMaxRotaryFrequencies.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

constexpr int kMaxRotaryFrequencies = 256;
Tensor Rotary(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse);

}  // namespace tessel::cuda
