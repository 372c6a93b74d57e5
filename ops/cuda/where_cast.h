// CUDA twins of the CPU's where and cast (ops/cpu/tensor_ops.h), and of
// equal, whose CPU kernel is written in its def file (ops/defs/where_cast.cc).
#pragma once

#include "core/tensor.h"

namespace tessel::cuda {

// Any dtype to any dtype, through float as on the CPU (i64 to i64 exactly).
Tensor Cast(const Tensor& x, DType dtype);
// cond ? a : b with broadcasting (cond bool; a, b of one floating dtype:
// f32, bf16 or f16), in a's dtype.
Tensor Where(const Tensor& cond, const Tensor& a, const Tensor& b);
// a == b with broadcasting (a, b of one floating dtype), as bool.
Tensor Equal(const Tensor& a, const Tensor& b);

}  // namespace tessel::cuda
