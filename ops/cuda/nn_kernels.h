// CUDA kernels of the network ops: dropout, embedding lookup, picking one
// class per row, patchify (ViT) and the optimizer updates. Same signatures
// and semantics as the CPU twins in ops/cpu/nn_kernels.h, except AdamW,
// whose step and learning rate stay on the device, and the dtypes: all but
// the optimizer updates take bf16 and f16 as well as f32 (outputs in the
// input's dtype, arithmetic in float); the updates keep f32 master weights.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

// y = x / (1 - p) where Philox(seed).Uniform(offset + logical index) >= p,
// else 0: the CPU's mask bit for bit, for any shard of the logical tensor.
// The offset is an i64 scalar on x's device, read by the kernel.
Tensor Dropout(const Tensor& x, double p, uint64_t seed, const Tensor& offset,
               const std::vector<int64_t>& box_begin, const std::vector<int64_t>& logical_shape);
// counter (an i64 scalar on the device) += by, on the stream.
void AdvanceCounter(const Tensor& counter, int64_t by);

// out[..., :] = table[id - vocab_begin, :] for ids in this shard's vocab
// range, zeros otherwise (vocab-parallel lookup).
Tensor Embedding(const Tensor& table, const Tensor& ids, int64_t vocab_begin);
// The table gradient, in dy's dtype: rows [vocab_begin, vocab_begin + rows)
// of the scatter-add of dy's rows at ids (atomic adds in f32, rounded once
// for bf16 and f16: the order of the additions to a row, and so its last
// bits, vary between runs).
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
// as (c, ky, kx).
Tensor Patchify(const Tensor& x, int64_t patch);
Tensor Unpatchify(const Tensor& patches, const Shape& image_shape, int64_t patch);

// PyTorch's AdamW step, as the CPU's: counts `step` (an i64 scalar on the
// device) up by one, then updates param, exp_avg and exp_avg_sq in place
// with the learning rate `lr` (an f32 scalar on the device). The kernels
// read both, so the host never waits for the device.
void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const Tensor& step, const Tensor& lr, double beta1, double beta2, double eps,
                 double weight_decay);
// PyTorch's SGD step with momentum and weight decay, updating param and the
// buffer in place. `first` starts the buffer from the gradient.
void SgdUpdate(const Tensor& param, const Tensor& grad, const Tensor& buffer, double lr, double momentum,
               double weight_decay, bool first);

}  // namespace tessel::cuda
