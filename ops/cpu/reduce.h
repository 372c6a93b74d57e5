// Reductions over a set of axes (sum, mean, max).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

enum class ReduceOp { kSum, kMean, kMax };
const char* ReduceOpName(ReduceOp op);
// Reduces f32 `x` over `axes` (negative axes count from the end; empty
// means all). Sums accumulate in double.
Tensor Reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim);
// Gradient of a max reduction: dy goes to the (first) position of the max.
Tensor ReduceMaxGrad(const Tensor& x, const std::vector<int64_t>& axes, const Tensor& dy_keepdim);

}  // namespace tessel::cpu
