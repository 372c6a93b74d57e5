// Rotary position embeddings (RoFormer; Llama's "rotate half" layout): the
// two halves of each head's features rotate by the angle position x
// inv_freq[j]:
//   y[j]       = x[j] cos - x[j + d/2] sin
//   y[j + d/2] = x[j + d/2] cos + x[j] sin        (j < d/2)
// With `inverse` the rotation goes back (sin negated): the gradient.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

// x [batch, seq, heads, d] f32; positions i64 [batch, seq] or [seq];
// inv_freq has d/2 entries.
Tensor Rotary(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse);

}  // namespace tessel::cpu
