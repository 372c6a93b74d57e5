// CUDA twins of ops/cpu/reduce.h: sum, mean and max over axes, and the
// broadcast copy (expand) their gradients use. f32, bf16 and f16; results
// have the input's dtype.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/cpu/reduce.h"

namespace tessel::cuda {

using cpu::ReduceOp;

// Reduces `x` over `axes` (negative axes count from the end; empty means
// all). Sums accumulate in double, as on the CPU; results round to float,
// and from float to bf16 or f16.
Tensor Reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim);
// The sum over `axes` divided by `divisor` (a sharded input's logical
// count) before rounding: bf16 and f16 means round once, not after the sum
// and again after the division.
Tensor Mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, double divisor);
// `x` broadcast to `shape` (NumPy rules), materialised: expand's kernel.
Tensor BroadcastTo(const Tensor& x, const Shape& shape);

}  // namespace tessel::cuda
