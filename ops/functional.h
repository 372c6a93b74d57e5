// Functional ops: what layers and gradient functions call. Each builds an
// op application and hands it to this thread's current interpreter
// (ops/interpreter.h; graph/ provides them: eager with autograd by default,
// a lazy graph builder while it traces).
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/interpreter.h"
#include "ops/op_def.h"

namespace tessel {

// Applies a registered op by name.
std::vector<Tensor> ApplyOp(const std::string& name, const std::vector<Tensor>& inputs,
                            const Attrs& attrs = {});

namespace fn {
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// x [..., k] W [k, n] + b [n] as one op (on a GPU the bias, and the
// activation of linear_gelu_tanh, in the GEMM's epilogue).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear_gelu_tanh(const Tensor& x, const Tensor& weight, const Tensor& bias);
// x W + b + residual (a skip connection, shaped as the output).
Tensor linear_residual(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual);
// {dW [k, n], db [n]} of a linear op from its input x [..., k] and output gradient dy [..., n].
std::vector<Tensor> linear_weight_grad(const Tensor& x, const Tensor& dy);
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, double s);
Tensor mul_scalar(const Tensor& a, double s);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);       // erf form
Tensor gelu_tanh(const Tensor& x);  // tanh approximation
Tensor tanh(const Tensor& x);
Tensor neg(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false);
// Sums a broadcast result back to `shape` (the gradient of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor softmax(const Tensor& x);  // over the last dimension
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) * weight over the last dimension (Llama's RMSNorm).
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// The frequencies of rotary position embeddings: theta^(-2j/head_dim), and
// optionally Llama 3's scaling of the long wavelengths (scaling_factor > 0).
struct RotaryOptions {
  double theta = 10000;
  double scaling_factor = 0;  // 0: none
  double low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_positions = 8192;
};
// x [batch, seq, heads, head_dim] rotated by positions ([batch, seq] or
// [seq], i64) in the "rotate half" layout of Hugging Face's Llama.
Tensor rotary(const Tensor& x, const Tensor& positions, const RotaryOptions& options = {});
// silu(gate) * up (Llama's MLP), gate and up of one shape.
Tensor swiglu(const Tensor& gate, const Tensor& up);
// x broadcast to `shape`, with size-1 axes inserted at `new_axes` (positions
// in `shape`) first; dimensions of size 1 stretch.
Tensor expand(const Tensor& x, const Shape& shape, const std::vector<int64_t>& new_axes = {});
// Mean over rows whose label is not ignore_index of the per-row loss.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// Per-row loss (reduction none).
Tensor cross_entropy_rows(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& perm);
Tensor slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along `dim` (they must add up to its size).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim = false);
// softmax(scale * x) over the last dim, keys where `mask` is false removed
// (mask broadcasts to x; undefined: none), and with `causal`, key j hidden
// from query i when j > i + (keys - queries). Fully masked rows give zeros.
Tensor scale_mask_softmax(const Tensor& x, const Tensor& mask, double scale, bool causal);
// softmax(scale * q k^T) v over the last two dims of q [..., sq, d] and k, v
// [..., sk, d], with `causal` as scale_mask_softmax's, without the [sq, sk]
// score matrix (flash attention): the same values as
// matmul(scale_mask_softmax(matmul(q, k^T), none, scale, causal), v).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal);
// {q, k, v} [b, heads, s, d] from a fused projection x [b, s, heads, 3 d]
// (each head's q, k and v side by side) in one copy; merge_qkv is the inverse.
std::vector<Tensor> split_qkv(const Tensor& x);
Tensor merge_qkv(const Tensor& q, const Tensor& k, const Tensor& v);
// attention(split_qkv(x)) permuted to [b, s, heads, d] in one op: q, k and v
// read where they lie in x [b, s, heads, 3 d].
Tensor qkv_attention(const Tensor& x, double scale, bool causal);
Tensor cast(const Tensor& x, DType dtype);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor equal(const Tensor& a, const Tensor& b);
// x with `value` where mask is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
Tensor sqrt(const Tensor& x);
// Inverted dropout with keep mask Philox(seed).Uniform(offset + logical
// index) >= p: the same logical mask under any layout. `offset` is an i64
// scalar tensor beside x (replicated on its placement, or on its device).
Tensor dropout(const Tensor& x, const Tensor& offset, double p, int64_t seed);
// The same with the offset given as a number.
Tensor dropout(const Tensor& x, double p, int64_t seed, int64_t offset = 0);
// A random stream's position as a value: a copy of `counter` (an i64
// scalar) as it is now, which a later rng_advance does not change. `like`
// orders it among the ops of the tensor it draws for (a micro-batch's copy
// of the step reads the counter after the copy before it advanced it); its
// data is not read.
Tensor rng_offset(const Tensor& counter, const Tensor& like);
// counter += like's (logical) element count, in place; returns counter.
// Not differentiable.
Tensor rng_advance(const Tensor& counter, const Tensor& like);
// table [V, H] rows at ids; a table split on V (vocab-parallel) gives a
// partial sum reduced only when needed.
// padding_idx >= 0: that row's lookups pass no gradient to the table (as
// torch.nn.Embedding's padding_idx).
Tensor embedding(const Tensor& table, const Tensor& ids, int64_t padding_idx = -1);
// x[i, labels[i]] (0 for ignore_index).
Tensor pick(const Tensor& x, const Tensor& labels, int64_t ignore_index = -100);
// [B, C, H, W] -> [B, patches, C*p*p] (conv2d with stride = kernel = p is
// patchify then matmul with the flattened kernel).
Tensor patchify(const Tensor& images, int64_t patch);
// sqrt(sum of squares of every tensor): the global gradient norm. For global
// tensors it reduces over the ranks that hold each part.
Tensor global_norm(const std::vector<Tensor>& xs);
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
};
// One AdamW step (PyTorch's), in place: counts `step` (an i64 scalar, 0
// before the first update) up by one, then updates param, exp_avg and
// exp_avg_sq (which keep their layouts) with learning rate `lr` (an f32
// scalar); returns param, exp_avg, exp_avg_sq and step. The scalars are
// replicated on the parameter's placement (see ReplicatedScalar).
std::vector<Tensor> adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const Tensor& step, const Tensor& lr,
                                 const AdamWOptions& options);
// dst's values replaced by src's, in place (src is laid out like dst
// first); returns dst. Not differentiable.
Tensor assign(const Tensor& dst, const Tensor& src);
// One SGD step with momentum (PyTorch's), in place: updates param and
// momentum_buffer and returns those same tensors.
std::vector<Tensor> sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                               double lr, double momentum, double weight_decay, bool first_step);
}  // namespace fn

}  // namespace tessel
