// Matrix multiplication on CUDA devices through cuBLAS: one handle per
// device, made on first use, run on cuda::CurrentStream() with a workspace
// allocated once.
//
// f32 products use full f32 arithmetic (CUBLAS_COMPUTE_32F), so they match
// the CPU to 1e-5. Setting TESSEL_CUDA_ALLOW_TF32=1 in the environment lets
// cuBLAS use TF32 tensor cores instead (CUBLAS_COMPUTE_32F_FAST_TF32:
// several times faster, about 1e-3 relative error); the variable is read once,
// at the first product. bf16 and f16 products (mixed-precision training)
// take their operands and result in that type and accumulate in f32
// (CUBLAS_COMPUTE_32F) whatever the variable says.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

// Row-major C[m,n] = alpha * op(A) * op(B) + beta * C with op(X) = X or X^T,
// on f32 device pointers of the current device.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// a [..., m, k] (or [..., k, m] with trans_a) times b [..., k, n] (or
// [..., n, k] with trans_b). Batch dimensions broadcast; a 2-D operand is
// shared by every batch. a and b are both f32, bf16 or f16, and so is the
// result. Throws naming both shapes if they do not fit, and both dtypes if
// they differ.
Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// The linear ops: {x W + b (+ residual)} or, with gelu, {gelu_tanh(x W + b),
// x W + b} for x [..., k], W [k, n], b [n] (a residual like the output),
// through cuBLASLt's bias (and GELU) epilogue, the residual as its C; where
// cuBLASLt has no algorithm for the problem, Matmul and the elementwise
// kernels.
std::vector<Tensor> Linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
                           const Tensor& residual = Tensor());
// {x^T dy [k, n], dy summed over its rows [n]} for x [..., k], dy [..., n]:
// one GEMM with cuBLASLt's bias-gradient epilogue (or, failing that, a GEMM
// and a reduction).
std::vector<Tensor> LinearWeightGrad(const Tensor& x, const Tensor& dy);

}  // namespace tessel::cuda
