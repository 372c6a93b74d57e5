// CUDA twins of ops/cpu/reduce.h: sum, mean and max of f32 over axes, and
// the broadcast copy (expand) their gradients use.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/cpu/reduce.h"

namespace tessel::cuda {

using cpu::ReduceOp;

// Reduces f32 `x` over `axes` (negative axes count from the end; empty
// means all). Sums accumulate in double, as on the CPU.
Tensor Reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim);
// f32 `x` broadcast to `shape` (NumPy rules), materialised: expand's kernel.
Tensor BroadcastTo(const Tensor& x, const Shape& shape);

}  // namespace tessel::cuda
