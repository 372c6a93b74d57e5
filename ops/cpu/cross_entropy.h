// Sparse softmax cross-entropy: logits [N, C], integer labels [N].
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessel::cpu {

// Per-row loss logsumexp(z) - z[label]; rows whose label is ignore_index
// get 0. Labels must lie in [0, C) otherwise (the error names the row).
Tensor SparseCrossEntropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// dL/dlogits = (softmax(z) - onehot(label)) * dloss[row]; ignored rows 0.
Tensor SparseCrossEntropyGrad(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                              int64_t ignore_index = -100);

}  // namespace tessel::cpu
