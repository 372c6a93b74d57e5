// CUDA twins of ops/cpu/elementwise.h: binary ops with NumPy broadcasting
// (f32, bf16, f16, i64), ops with a scalar, activations and their
// gradients (f32, bf16, f16). 16-bit values compute in float and round
// once to their dtype; results have the inputs' dtype.
#pragma once

#include "core/tensor.h"
#include "ops/cpu/elementwise.h"

namespace tessel::cuda {

using cpu::BinaryOp;
using cpu::UnaryOp;

Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b);
// a op scalar.
Tensor BinaryScalar(BinaryOp op, const Tensor& a, double scalar);
// Sums `grad` (of a broadcast result) down to `shape`: the gradient of an
// operand that was broadcast.
Tensor SumToShape(const Tensor& grad, const Shape& shape);

Tensor Unary(UnaryOp op, const Tensor& x);
// dL/dx from x and dL/dy.
Tensor UnaryGrad(UnaryOp op, const Tensor& x, const Tensor& dy);

}  // namespace tessel::cuda
