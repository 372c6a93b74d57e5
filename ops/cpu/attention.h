// Attention without the score matrix: out = softmax(scale * q k^T, causal)
// v, row by row with a running maximum, as flash attention computes it; the
// gradient recomputes each row's probabilities from the saved log-sum-exp.
// q is [..., sq, d]; k and v are [..., sk, d] with the same leading dims.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

struct AttentionOptions {
  float scale = 1.0f;
  // Key j of query i (local row) is visible when j <= i + causal_shift: the
  // causal mask aligned at the last key, as scale_mask_softmax's
  // (causal_shift = query_offset + sk - queries for a shard of the queries).
  bool causal = false;
  int64_t causal_shift = 0;
};

// {out [..., sq, d] in q's dtype, lse [..., sq] f32}. A row that sees no key
// gets zeros and lse +inf.
std::vector<Tensor> Attention(const Tensor& q, const Tensor& k, const Tensor& v,
                              const AttentionOptions& options);
// {dq, dk, dv} from the forward's inputs, out, lse and dL/dout.
std::vector<Tensor> AttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionOptions& options);

}  // namespace tessel::cpu
