#include "models/llama.h"

#include <cmath>
#include <optional>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "layers/transformer.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::models {

namespace {
// Checks the shape of the heads against the layout before any parameter
// is drawn; returns hidden.
int64_t CheckLlama(const LlamaConfig& c) {
  const dist::Config& d = dist::GetConfig();
  const int64_t tp = d.tensor_parallel_size, kv = c.key_value_heads();
  TESSEL_CHECK(c.hidden > 0 && c.heads > 0 && c.hidden % c.heads == 0)
      << "Llama: hidden=" << c.hidden << " is not divisible by heads=" << c.heads;
  TESSEL_CHECK((c.hidden / c.heads) % 2 == 0)
      << "Llama: head_dim=" << c.hidden / c.heads << " (hidden / heads) must be even for rotary embeddings";
  TESSEL_CHECK(kv > 0 && c.heads % kv == 0)
      << "Llama: heads=" << c.heads << " is not divisible by kv_heads=" << kv;
  TESSEL_CHECK(kv % tp == 0) << "Llama: kv_heads=" << kv << " is not divisible by tensor_parallel_size=" << tp
                             << " (each rank holds whole key/value heads, as in Megatron-LM)";
  TESSEL_CHECK(!dist::MultiAxisTensorParallel())
      << "Llama: tensor_parallel_mode '" << d.tensor_parallel_mode << "' is not supported; use the 1d mode";
  TESSEL_CHECK(!d.all_to_all_sequence_parallel && !d.context_parallel)
      << "Llama: " << (d.context_parallel ? "context" : "all-to-all sequence")
      << " parallelism is not supported (Megatron's sequence parallelism is)";
  TESSEL_CHECK(c.layers > 0) << "Llama: layers=" << c.layers << "; expected at least 1";
  return c.hidden;
}

// positions as the layer at `placement` reads them: global, replicated over
// tp; a per-row [batch, seq] tensor split over dp like the batch.
Tensor PositionsOn(const Tensor& positions, const Placement& placement) {
  if (positions.ndim() == 2) return layers::ToHidden(positions, placement);
  return layers::OnPlacement(positions, placement);
}
}  // namespace

int64_t LlamaConfig::ffn_size() const {
  if (ffn_hidden > 0) return ffn_hidden;
  const int64_t two_thirds = 2 * (4 * hidden) / 3;
  return (two_thirds + 255) / 256 * 256;
}

LlamaAttention::LlamaAttention(const LlamaConfig& c, int64_t layer_idx)
    : qkv_proj(CheckLlama(c), (c.heads + 2 * c.key_value_heads()) * (c.hidden / c.heads),
               {.parallel = layers::Parallel::kCol,
                .bias = false,
                .layer_idx = layer_idx,
                .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1),
                .init_std = c.init_std}),
      o_proj(c.hidden, c.hidden,
             {.parallel = layers::Parallel::kRow,
              .bias = false,
              .layer_idx = layer_idx,
              .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + 3,
              .init_std = c.init_std}),
      heads_(c.heads),
      kv_heads_(c.key_value_heads()),
      head_dim_(c.hidden / c.heads),
      rope_(c.rope),
      fused_(c.fused_attention) {
  RegisterModule("qkv_proj", qkv_proj);
  RegisterModule("o_proj", o_proj);
}

Tensor LlamaAttention::operator()(const Tensor& x, const Tensor& positions, const Tensor& mask,
                                  const Tensor& residual) const {
  const int64_t b = x.shape()[0], s = x.shape()[1], group = heads_ / kv_heads_;
  // [b, s, kv_heads, group + 2, head_dim]: the column split over tp hands
  // each rank whole key/value groups, which the slices and the rotation
  // keep where they are.
  const Tensor t = fn::reshape(qkv_proj(x), {b, s, kv_heads_, group + 2, head_dim_});
  const Tensor q =
      fn::rotary(fn::reshape(fn::slice(t, 3, 0, group), {b, s, heads_, head_dim_}), positions, rope_);
  const Tensor k = fn::rotary(fn::reshape(fn::slice(t, 3, group, group + 1), {b, s, kv_heads_, head_dim_}),
                              positions, rope_);
  const Tensor v = fn::reshape(fn::slice(t, 3, group + 1, group + 2), {b, s, kv_heads_, head_dim_});
  // Each key/value head serves `group` query heads side by side (Hugging
  // Face's repeat_kv): on each rank its own query heads' groups, as tp
  // splits key/value heads and query heads alike.
  auto heads_first = [&](const Tensor& t) {
    Tensor h = fn::permute(t, {0, 2, 1, 3});  // [b, kv_heads, s, head_dim]
    if (group == 1) return h;
    return fn::reshape(fn::expand(h, {b, kv_heads_, group, s, head_dim_}, {2}), {b, heads_, s, head_dim_});
  };
  const Tensor qh = fn::permute(q, {0, 2, 1, 3}), kh = heads_first(k), vh = heads_first(v);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  const DeviceType device = x.is_global() ? x.placement().device_type() : x.device().type();
  Tensor ctx;  // [b, heads, s, head_dim]
  if (fused_ && device == DeviceType::kCUDA && x.dtype() != DType::kFloat32 && !mask.defined()) {
    ctx = fn::attention(qh, kh, vh, scale, /*causal=*/true);
  } else {
    ctx =
        fn::matmul(fn::scale_mask_softmax(fn::matmul(qh, kh, false, true), mask, scale, /*causal=*/true), vh);
  }
  ctx = fn::reshape(fn::permute(ctx, {0, 2, 1, 3}), {b, s, heads_ * head_dim_});
  return o_proj(ctx, layers::LinearActivation::kNone, residual);
}

LlamaMLP::LlamaMLP(const LlamaConfig& c, int64_t layer_idx)
    : gate_up_proj(c.hidden, 2 * c.ffn_size(),
                   {.parallel = layers::Parallel::kCol,
                    .bias = false,
                    .layer_idx = layer_idx,
                    .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + 10,
                    .init_std = c.init_std}),
      down_proj(c.ffn_size(), c.hidden,
                {.parallel = layers::Parallel::kRow,
                 .bias = false,
                 .layer_idx = layer_idx,
                 .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + 12,
                 .init_std = c.init_std}),
      ffn_(c.ffn_size()) {
  RegisterModule("gate_up_proj", gate_up_proj);
  RegisterModule("down_proj", down_proj);
}

Tensor LlamaMLP::operator()(const Tensor& x, const Tensor& residual) const {
  // [..., ffn, 2]: gate and up of each inner feature side by side.
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = ffn_;
  std::vector<int64_t> pairs = dims;
  pairs.push_back(2);
  const Tensor both = fn::reshape(gate_up_proj(x), Shape(pairs));
  const int64_t last = static_cast<int64_t>(pairs.size()) - 1;
  const Tensor gate = fn::reshape(fn::slice(both, last, 0, 1), Shape(dims));
  const Tensor up = fn::reshape(fn::slice(both, last, 1, 2), Shape(dims));
  return down_proj(fn::swiglu(gate, up), layers::LinearActivation::kNone, residual);
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& c, int64_t layer_idx)
    : input_layernorm(c.hidden, c.rms_norm_eps, layer_idx),
      self_attn(c, layer_idx),
      post_attention_layernorm(c.hidden, c.rms_norm_eps, layer_idx),
      mlp(c, layer_idx),
      layer_idx_(layer_idx),
      activation_checkpoint_(c.activation_checkpoint) {
  RegisterModule("input_layernorm", input_layernorm);
  RegisterModule("self_attn", self_attn);
  RegisterModule("post_attention_layernorm", post_attention_layernorm);
  RegisterModule("mlp", mlp);
}

Tensor LlamaDecoderLayer::operator()(const Tensor& x_in, const Tensor& positions_in,
                                     const Tensor& mask_in) const {
  LayerScope layer(layer_idx_);  // a trace tags this layer's ops (and their gradients) with it
  const Placement& p = input_layernorm.weight.placement();
  Tensor x = layers::ToActivations(x_in, p);  // move to this layer's stage
  const Tensor positions = PositionsOn(positions_in, p);
  const Tensor mask = layers::OnPlacement(mask_in, p);
  std::optional<RecomputeScope> checkpoint;  // not around the moves: recomputing them would communicate again
  if (activation_checkpoint_) checkpoint.emplace();
  x = self_attn(input_layernorm(x), positions, mask, x);
  return mlp(post_attention_layernorm(x), x);
}

Llama::Llama(const LlamaConfig& c)
    : config_((CheckLlama(c), c)),  // before any parameter is drawn
      padded_vocab_(layers::PaddedVocabSizeLogged("Llama", c.vocab_size, c.make_vocab_size_divisible_by)),
      embed_tokens_(padded_vocab_, c.hidden, {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std}),
      norm_(c.hidden, c.rms_norm_eps, -1) {
  RegisterModule("embed_tokens", embed_tokens_);
  for (int64_t i = 0; i < c.layers; ++i) {
    layers_.push_back(std::make_unique<LlamaDecoderLayer>(c, i));
    RegisterModule(std::string("layers").append(std::to_string(i)), *layers_.back());
  }
  RegisterModule("norm", norm_);
  if (!c.tie_word_embeddings) {
    lm_head_ = std::make_unique<layers::VocabEmbedding>(
        padded_vocab_, c.hidden,
        layers::EmbeddingOptions{.layer_idx = -1, .seed = c.seed + 1, .init_std = c.init_std});
    RegisterModule("lm_head", *lm_head_);
  }
}

Tensor Llama::Logits(const Tensor& ids, const Tensor& position_ids, const Tensor& attention_mask) const {
  const int64_t batch = ids.shape()[0], seq = ids.shape()[1];
  layers::CheckTokenInputs("Llama", ids, position_ids, attention_mask, config_.max_seq);
  const Tensor positions = layers::PositionsOrRange(position_ids, seq);
  Tensor h = embed_tokens_(ids);
  // [batch, seq] -> [batch, 1, 1, seq]: a padded key is hidden from every
  // query of its row and every head.
  const Tensor mask = attention_mask.defined() ? fn::reshape(attention_mask, {batch, 1, 1, seq}) : Tensor();
  for (const auto& layer : layers_) h = (*layer)(h, positions, mask);
  h = norm_(h);
  const Tensor& table = lm_head_ ? lm_head_->weight : embed_tokens_.weight;
  return layers::MaskPaddedLogits(layers::LMLogits(h, layers::ForCompute(table)), config_.vocab_size);
}

Tensor Llama::Loss(const Tensor& ids, const Tensor& labels, const Tensor& position_ids,
                   const Tensor& attention_mask) const {
  return layers::ParallelCrossEntropyLoss(Logits(ids, position_ids, attention_mask), labels);
}

}  // namespace tessel::models
