// Elementwise kernels: binary ops with NumPy broadcasting, ops with a
// scalar, activations and their gradients. f32 (binary ops also i64).
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

enum class BinaryOp { kAdd, kSub, kMul, kDiv };
const char* BinaryOpName(BinaryOp op);
Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b);
// a op scalar.
Tensor BinaryScalar(BinaryOp op, const Tensor& a, double scalar);
// Sums `grad` (of a broadcast result) down to `shape`: the gradient of an
// operand that was broadcast.
Tensor SumToShape(const Tensor& grad, const Shape& shape);

enum class UnaryOp { kRelu, kGeluErf, kGeluTanh, kTanh, kExp, kLog, kSqrt, kNeg };
const char* UnaryOpName(UnaryOp op);
Tensor Unary(UnaryOp op, const Tensor& x);
// dL/dx from x and dL/dy.
Tensor UnaryGrad(UnaryOp op, const Tensor& x, const Tensor& dy);

}  // namespace tessel::cpu
