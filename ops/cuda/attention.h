// Attention without the score matrix on CUDA devices (the semantics of
// ops/cpu/attention.h): f32, bf16 and f16 (sums in f32). bf16 and f16 with a
// head size of 64 or 128 run FlashAttention-2-style kernels on the tensor
// cores (mma.sync, with scores, probabilities and outputs in registers; 64
// keys per step; the probabilities rounded to the dtype before they
// multiply v, as FlashAttention does); anything else runs a warp per query
// row.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/cpu/attention.h"

namespace tessel::cuda {

using AttentionOptions = cpu::AttentionOptions;

// {out in q's dtype, lse f32}; see cpu::Attention.
std::vector<Tensor> Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& options);
// {dq, dk, dv}; see cpu::AttentionGrad.
std::vector<Tensor> AttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionOptions& options);

// qkv_attention: {out [b, s, heads, d], lse [b, heads, s]} from the fused
// projection x [b, s, heads, 3 d] (see ops/defs/qkv_attention.cc). The
// tensor-core kernels read q, k and v where they lie in x and write out in
// its final layout; elsewhere SplitQkv, Attention and a permute.
std::vector<Tensor> QkvAttention(const Tensor& x, const AttentionOptions& options);
// dx [b, s, heads, 3 d], the tensor-core kernels writing dq, dk and dv into
// their places in it (or Attention's gradient and MergeQkv).
Tensor QkvAttentionGrad(const Tensor& x, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& options);

}  // namespace tessel::cuda
