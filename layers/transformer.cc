#include "layers/transformer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

namespace {
// `nd_sbp` with its data-parallel entry (the first axis; dp > 1) replaced.
NdSbp WithDataParallelSbp(const NdSbp& nd_sbp, const Sbp& dp) {
  std::vector<Sbp> sbps = nd_sbp.sbps();
  sbps[0] = dp;
  return NdSbp(sbps);
}

int64_t CheckHeads(int64_t hidden, int64_t heads) {
  const int64_t tp = dist::GetConfig().tensor_parallel_size, parts = dist::ColumnFeatureParts();
  TESSEL_CHECK(heads > 0 && hidden % heads == 0)
      << "MultiheadAttention: hidden=" << hidden << " is not divisible by heads=" << heads;
  TESSEL_CHECK(heads % parts == 0) << "MultiheadAttention: heads=" << heads << " is not divisible by "
                                   << (parts == tp ? "tensor_parallel_size="
                                                   : "the head groups of tensor_parallel_mode '" +
                                                         dist::GetConfig().tensor_parallel_mode + "': ")
                                   << parts;
  return hidden;
}
}  // namespace

MultiheadAttention::MultiheadAttention(int64_t hidden, int64_t heads, AttentionOptions options)
    : qkv(CheckHeads(hidden, heads), 3 * hidden,
          {.parallel = Parallel::kCol,
           .layer_idx = options.layer_idx,
           .seed = options.seed,
           .init_std = options.init_std}),
      out(hidden, hidden,
          {.parallel = Parallel::kRow,
           .layer_idx = options.layer_idx,
           .seed = options.seed + 1,
           .init_std = options.init_std}),
      hidden_(hidden),
      heads_(heads),
      options_(options),
      probs_dropout_(options.dropout, options.seed + 2) {
  RegisterModule("qkv", qkv);
  RegisterModule("out", out);
  RegisterModule("probs_dropout", probs_dropout_);
}

bool MultiheadAttention::UsesFusedAttention(const Tensor& q, const Tensor& mask) const {
  const DeviceType device = q.is_global() ? q.placement().device_type() : q.device().type();
  return options_.fused && device == DeviceType::kCUDA && q.dtype() != DType::kFloat32 && !mask.defined() &&
         !probs_dropout_.drops() && !dist::MultiAxisTensorParallel();
}

Tensor MultiheadAttention::operator()(const Tensor& x, const Tensor& mask, const Tensor& residual) const {
  const int64_t b = x.shape()[0], s = x.shape()[1], hd = hidden_ / heads_;
  // Head-major features: a split over tp keeps whole heads together.
  Tensor t = fn::reshape(qkv(x), {b, s, heads_, 3 * hd});
  // All-to-all sequence parallelism: the dp ranks hold parts of each
  // sequence; attention needs whole ones, so they trade them for parts of
  // the heads (one all-to-all for q, k and v together) and trade back after.
  // The heads go [tp groups, heads per group] first: splits nest from the
  // outer mesh axis (dp) in, so the dp ranks split each tp rank's own heads
  // only when the tp split is a dimension of its own. The all-to-all then
  // stays inside each data-parallel group.
  //
  // Context parallelism: the dp ranks hold parts of each sequence too; the
  // queries stay split and every key and value is gathered, so each rank
  // scores its queries against the whole sequence (the causal mask placed by
  // its queries' offset).
  const int64_t tp = dist::GetConfig().tensor_parallel_size;
  const bool all_to_all = dist::GetConfig().all_to_all_sequence_parallel && t.is_global();
  const bool context = dist::GetConfig().context_parallel && t.is_global();
  // On this layer's stage; a local mask is the whole mask on every rank.
  Tensor m = OnPlacement(mask, qkv.weight.placement());
  if (m.defined() && (all_to_all || context) && m.is_global())  // a mask of keys: every key's
    m = m.to_global(m.placement(), WithDataParallelSbp(m.nd_sbp(), B()));
  if (m.defined() && all_to_all) m = fn::reshape(m, {b, 1, 1, 1, s});  // one more head dimension
  const double scale = 1.0 / std::sqrt(double(hd));
  const bool whole_sequences = !all_to_all && !context && !dist::MultiAxisTensorParallel();
  if (whole_sequences && UsesFusedAttention(t, m)) {
    // q, k and v read where they lie in t, the output written as the
    // output projection reads it: no split, permute or merge around it.
    return out(fn::reshape(fn::qkv_attention(t, scale, options_.causal), {b, s, hidden_}),
               LinearActivation::kNone, residual);
  }
  Tensor q, k, v;
  if (whole_sequences) {
    // [b, heads, s, hd] each in one copy (and one back in the gradient).
    const std::vector<Tensor> parts = fn::split_qkv(t);
    q = parts[0];
    k = parts[1];
    v = parts[2];
  } else {
    t = fn::permute(t, {0, 2, 1, 3});  // [b, heads, s, 3 hd]
    if (all_to_all) {
      t = fn::reshape(t, {b, tp, heads_ / tp, s, 3 * hd});
      t = t.to_global(t.placement(), WithDataParallelSbp(t.nd_sbp(), S(2)));
    }
    const int last = static_cast<int>(t.ndim()) - 1;
    q = fn::slice(t, last, 0, hd);
    k = fn::slice(t, last, hd, 2 * hd);
    v = fn::slice(t, last, 2 * hd, 3 * hd);
  }
  if (dist::MultiAxisTensorParallel() && t.is_global()) {
    // Queries stay split on the sequence (3d); every key and value is needed.
    k = k.to_global(k.placement(), dist::AttentionKeySbp(k.nd_sbp()));
    v = v.to_global(v.placement(), dist::AttentionKeySbp(v.nd_sbp()));
  }
  if (context) {
    k = k.to_global(k.placement(), WithDataParallelSbp(k.nd_sbp(), B()));
    v = v.to_global(v.placement(), WithDataParallelSbp(v.nd_sbp(), B()));
  }
  Tensor ctx;  // [b, heads, s, hd] ([b, tp, heads / tp, s, hd])
  if (!context && UsesFusedAttention(q, m)) {
    ctx = fn::attention(q, k, v, scale, options_.causal);
  } else {
    Tensor probs = fn::scale_mask_softmax(fn::matmul(q, k, false, true), m, scale, options_.causal);
    ctx = fn::matmul(probs_dropout_(probs), v);
  }
  if (all_to_all) {
    ctx = ctx.to_global(ctx.placement(), WithDataParallelSbp(ctx.nd_sbp(), S(3)));
    ctx = fn::reshape(ctx, {b, heads_, s, hd});
  }
  ctx = fn::permute(ctx, {0, 2, 1, 3});  // [b, s, heads, hd]
  return out(fn::reshape(ctx, {b, s, hidden_}), LinearActivation::kNone, residual);
}

MLP::MLP(int64_t hidden, int64_t ffn_hidden, int64_t layer_idx, uint64_t seed, double init_std,
         Activation activation)
    : fc1(hidden, ffn_hidden,
          {.parallel = Parallel::kCol, .layer_idx = layer_idx, .seed = seed, .init_std = init_std}),
      fc2(ffn_hidden, hidden,
          {.parallel = Parallel::kRow, .layer_idx = layer_idx, .seed = seed + 1, .init_std = init_std}),
      activation_(activation) {
  RegisterModule("fc1", fc1);
  RegisterModule("fc2", fc2);
}

Tensor MLP::operator()(const Tensor& x, const Tensor& residual) const {
  // GPT-2's tanh form goes in fc1's op (on a GPU, the GEMM's epilogue).
  const Tensor h =
      activation_ == Activation::kGeluTanh ? fc1(x, LinearActivation::kGeluTanh) : fn::gelu(fc1(x));
  return fc2(h, LinearActivation::kNone, residual);
}

TransformerLayer::TransformerLayer(int64_t hidden, int64_t heads, int64_t ffn_hidden,
                                   TransformerLayerOptions o)
    : ln1(hidden, o.layernorm_epsilon, o.layer_idx),
      ln2(hidden, o.layernorm_epsilon, o.layer_idx),
      attention(hidden, heads,
                {.layer_idx = o.layer_idx,
                 .causal = o.causal,
                 .seed = o.seed,
                 .init_std = o.init_std,
                 .dropout = o.attention_dropout,
                 .fused = o.fused_attention}),
      mlp(hidden, ffn_hidden, o.layer_idx, o.seed + 10, o.init_std, o.activation),
      options_(o),
      attention_output_dropout_(o.hidden_dropout, o.seed + 20),
      mlp_output_dropout_(o.hidden_dropout, o.seed + 21) {
  RegisterModule("ln1", ln1);
  RegisterModule("attention", attention);
  RegisterModule("ln2", ln2);
  RegisterModule("mlp", mlp);
  RegisterModule("attention_output_dropout", attention_output_dropout_);
  RegisterModule("mlp_output_dropout", mlp_output_dropout_);
}

Tensor TransformerLayer::operator()(const Tensor& x_in, const Tensor& mask) const {
  LayerScope layer(options_.layer_idx);  // a trace tags this layer's ops (and their gradients) with it
  Tensor x = ToActivations(x_in, ln1.weight.placement());  // move to this layer's stage
  std::optional<RecomputeScope> checkpoint;  // not around the move: recomputing it would communicate again
  if (options_.activation_checkpoint) checkpoint.emplace();
  // Without dropout the residual adds go into the output projections' ops
  // (on a GPU, the GEMMs' epilogues).
  const bool fuse_residual = !attention_output_dropout_.drops() && !mlp_output_dropout_.drops();
  if (options_.pre_ln) {
    if (fuse_residual) {
      x = attention(ln1(x), mask, x);
      return mlp(ln2(x), x);
    }
    x = fn::add(x, attention_output_dropout_(attention(ln1(x), mask)));
    return fn::add(x, mlp_output_dropout_(mlp(ln2(x))));
  }
  if (fuse_residual) {
    x = ln1(attention(x, mask, x));
    return ln2(mlp(x, x));
  }
  x = ln1(fn::add(x, attention_output_dropout_(attention(x, mask))));
  return ln2(fn::add(x, mlp_output_dropout_(mlp(x))));
}

Tensor LMLogits(const Tensor& h, const Tensor& embedding_table) {
  // The logits are computed where the hidden states are (the last pipeline
  // stage): a table kept on another stage (tied to the first stage's
  // embedding) comes over, and its gradient goes back, as in LiBai. Moving
  // the hidden states to the table instead would send activations back to
  // an earlier stage and forward again, which no pipeline schedule orders.
  Tensor table = embedding_table;
  if (h.is_global() && table.is_global() && h.placement() != table.placement())
    table = table.to_global(h.placement(), table.nd_sbp());
  // The logits are split over the vocabulary (tp); the hidden input's
  // gradient comes back partial over tp and is all-reduced here (or
  // reduce-scattered on the sequence, under sequence parallelism, whose
  // forward gathers it).
  Tensor x = ToActivations(h, table.placement());
  if (dist::MultiAxisTensorParallel()) {
    // The column layer of the multi-axis modes with the table as W^T.
    // The logits end split on the vocabulary (over the column output's
    // axes), their sequence whole (the loss flattens batch and sequence).
    const dist::LinearLayouts l = dist::MultiAxisLinearLayouts(/*column=*/true, /*data=*/false, x.ndim());
    std::vector<Sbp> logits = l.output.sbps();
    for (Sbp& s : logits)
      if (s.is_split(1)) s = B();
    return ReducedInto(
        fn::matmul(x.to_global(x.placement(), l.input_compute),
                   GatheredForCompute(table, dist::MultiAxisEmbeddingLayouts().table_compute), false, true),
        NdSbp(logits));
  }
  return fn::matmul(x.to_global(x.placement(), dist::GetHiddenSbp(), x.nd_sbp()), table, false, true);
}

Tensor MaskPaddedLogits(const Tensor& logits, int64_t vocab_size) {
  const int64_t padded = logits.shape()[-1];
  if (padded == vocab_size) return logits;
  std::vector<bool> padding(padded, false);
  std::fill(padding.begin() + vocab_size, padding.end(), true);
  Tensor mask = Tensor::FromVector<bool>(padding, {padded});
  if (logits.is_global()) {
    // Replicated from each rank's full copy, then sliced like the
    // vocabulary-split logits.
    const Placement& p = logits.placement();
    mask = FromLocal(mask, p, dist::GetNdSbp({B(), B()}), mask.shape())
               .to_global(p, dist::FeatureParameterSbp(logits.nd_sbp(), logits.ndim()));
  }
  return fn::masked_fill(logits, mask, kMaskedLogit);
}

Tensor ParallelCrossEntropyLoss(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  const int64_t b = logits.shape()[0], s = logits.shape()[1], v = logits.shape()[2];
  Tensor l = logits.is_global() && !labels.is_global() ? ToHidden(labels, logits.placement()) : labels;
  if (dist::SequencesSplitOverDataParallel() && logits.is_global()) {
    // Split on the sequence over dp: flattened sequence-major, the rows stay
    // split (on the outer dimension) instead of being gathered.
    return fn::cross_entropy(fn::reshape(fn::permute(logits, {1, 0, 2}), {s * b, v}),
                             fn::reshape(fn::permute(l, {1, 0}), {s * b}), ignore_index);
  }
  return fn::cross_entropy(fn::reshape(logits, {b * s, v}), fn::reshape(l, {b * s}), ignore_index);
}

}  // namespace tessel::layers
