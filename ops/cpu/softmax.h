// Softmax over the last dimension, optionally fused with a scale and a mask
// (the attention form: softmax(scale * x masked)).
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

struct SoftmaxOptions {
  float scale = 1.0f;
  // bool tensor broadcastable to x's shape; false entries are masked out.
  Tensor mask;
  // Mask position j > i of the last two dims (x is [..., q, k]; key j of
  // query i is visible when j <= i + k - q).
  bool causal = false;
  // x holds query rows [query_offset, query_offset + q) of `queries` (0: q)
  // under causal: a shard of scores split on the queries keeps each row's
  // causal limit as in the whole.
  int64_t query_offset = 0;
  int64_t queries = 0;
};

// Rows that are masked entirely become all zeros (not NaN).
Tensor Softmax(const Tensor& x, const SoftmaxOptions& options = {});
// dL/dx from y = Softmax(x) and dL/dy (the scale is applied; masked
// positions get zero).
Tensor SoftmaxGrad(const Tensor& y, const Tensor& dy, float scale = 1.0f);

}  // namespace tessel::cpu
