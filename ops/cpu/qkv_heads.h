// Attention's head-major layout from a fused q/k/v projection and back, in
// one copy each: x [b, s, heads, 3 d] (each head's q, k and v features side
// by side, as the fused projection's head-major columns give them) <-> q, k,
// v [b, heads, s, d]. Any dtype: the bytes move unchanged.
#pragma once

#include <array>
#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

// Each part's shape [b, heads, s, d] for x [b, s, heads, 3 d]; throws
// naming x's shape otherwise.
Shape SplitQkvPartShape(const Shape& x);
// x's shape [b, s, heads, 3 d] for q, k, v of one shape [b, heads, s, d]
// and one dtype; throws naming the three otherwise.
Shape MergeQkvShape(const std::array<Shape, 3>& parts, const std::array<DType, 3>& dtypes);

// {q, k, v}, each [b, heads, s, d], from x [b, s, heads, 3 d].
std::vector<Tensor> SplitQkv(const Tensor& x);
// x [b, s, heads, 3 d] from q, k, v [b, heads, s, d] (SplitQkv's inverse).
Tensor MergeQkv(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace tessel::cpu
