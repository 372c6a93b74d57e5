// Kernels of the network ops: dropout, embedding lookup, picking one class
// per row, patchify (ViT), and the optimizer updates.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

// y = x / (1 - p) where Philox(seed).Uniform(offset + logical index) >= p,
// else 0. `box_begin` and `logical_shape` place this shard in the logical
// tensor, so the mask does not depend on how it is split.
Tensor Dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset,
               const std::vector<int64_t>& box_begin, const std::vector<int64_t>& logical_shape);

// out[..., :] = table[id - vocab_begin, :] for ids in this shard's vocab
// range, zeros otherwise (vocab-parallel lookup).
Tensor Embedding(const Tensor& table, const Tensor& ids, int64_t vocab_begin);
// The table gradient: rows [vocab_begin, vocab_begin + rows) of the
// scatter-add of dy's rows at ids.
// Table rows [vocab_begin, vocab_begin + rows) of the lookup's gradient;
// ids equal to padding_idx (>= 0) contribute nothing.
Tensor EmbeddingGrad(const Tensor& ids, const Tensor& dy, int64_t vocab_begin, int64_t rows,
                     int64_t padding_idx = -1);

// out[i] = x[i, label[i] - class_begin] when that is in this shard's
// columns (and not ignore_index), else 0.
Tensor Pick(const Tensor& x, const Tensor& labels, int64_t class_begin, int64_t ignore_index);
// [N, columns] zeros with dy[i] at (i, label[i] - class_begin).
Tensor PickGrad(const Tensor& labels, const Tensor& dy, int64_t class_begin, int64_t columns,
                int64_t ignore_index);

// [B, C, H, W] -> [B, (H/p)(W/p), C*p*p], patches row-major, each flattened
// as (c, ky, kx): conv2d(stride = kernel = p) is then a matmul.
Tensor Patchify(const Tensor& x, int64_t patch);
Tensor Unpatchify(const Tensor& patches, const Shape& image_shape, int64_t patch);

struct AdamWConfig {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1 for the first update
};
// PyTorch's AdamW step, updating param, exp_avg and exp_avg_sq in place.
void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamWConfig& c);
// PyTorch's SGD step with momentum and weight decay, updating param and the
// buffer in place. `first` starts the buffer from the gradient, as PyTorch
// does.
void SgdUpdate(const Tensor& param, const Tensor& grad, const Tensor& buffer, double lr, double momentum,
               double weight_decay, bool first);

}  // namespace tessel::cpu
