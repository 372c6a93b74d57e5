// Matrix multiplication on the CPU through oneDNN, whose own ISA dispatch
// picks AVX-512 (and AMX where it applies) kernels at run time: tessel needs
// no environment variable to run fast.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace tessel::cpu {

// Row-major C[m,n] = alpha * op(A) * op(B) + beta * C with op(X) = X or X^T.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// a [..., m, k] (or [..., k, m] with trans_a) times b [..., k, n] (or
// [..., n, k] with trans_b). Batch dimensions broadcast; a 2-D operand is
// shared by every batch. f32. Throws naming both shapes if they do not fit.
Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// The linear ops' output shape [..., n] for x [..., k], weight [k, n] and
// bias [n]; throws naming `op` and all three shapes if they do not fit.
Shape LinearShape(const std::string& op, const Shape& x, const Shape& weight, const Shape& bias);

}  // namespace tessel::cpu
