// Sparse softmax cross-entropy on CUDA devices (logits [N, C] of f32, bf16
// or f16, i64 labels [N]), its gradient, and the masked mean over counted
// rows. The loss, dloss and the masked mean are f32 whatever the logits;
// the gradient takes the logits' dtype; the arithmetic is f32 (double for
// the sums of exponentials) whatever they are. The semantics are the CPU's
// (ops/cpu/cross_entropy.h, ops/defs/cross_entropy.cc) but for one check:
// the CPU throws, naming the row, for a label outside [0, C) that is not
// ignore_index; here the labels live on the device and are never read on
// the host (that would synchronise every step), so such a row gets a NaN
// loss and a NaN gradient instead, which shows in the loss.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tessel::cuda {

// Per-row loss logsumexp(z) - z[label]; rows whose label is ignore_index
// get 0.
Tensor SparseCrossEntropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// dL/dlogits = (softmax(z) - onehot(label)) * dloss[row]; ignored rows 0.
Tensor SparseCrossEntropyGrad(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                              int64_t ignore_index = -100);

// The f32 scalar sum(rows) / (number of labels that are not ignore_index),
// 0 when every label is ignored.
Tensor MaskedMean(const Tensor& rows, const Tensor& labels, int64_t ignore_index);
// [labels' shape] f32: dy / count where the label counts, 0 where ignored
// (dy a one-element f32 tensor on the device).
Tensor MaskedMeanGrad(const Tensor& dy, const Tensor& labels, int64_t ignore_index);

}  // namespace tessel::cuda
