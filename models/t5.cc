#include "models/t5.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "layers/transformer.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::models {

namespace {
const T5Config& CheckT5(const T5Config& c) {
  const dist::Config& d = dist::GetConfig();
  TESSEL_CHECK(c.hidden > 0 && c.heads > 0 && (c.head_dim > 0 || c.hidden % c.heads == 0))
      << "T5: hidden=" << c.hidden << " is not divisible by heads=" << c.heads << " (or give head_dim)";
  TESSEL_CHECK(c.heads % d.tensor_parallel_size == 0)
      << "T5: heads=" << c.heads << " is not divisible by tensor_parallel_size=" << d.tensor_parallel_size;
  TESSEL_CHECK(c.encoder_layers > 0 && c.decoder_layers > 0)
      << "T5: encoder_layers=" << c.encoder_layers << ", decoder_layers=" << c.decoder_layers
      << "; expected at least one each";
  TESSEL_CHECK(c.relative_buckets >= 4 && c.relative_max_distance > c.relative_buckets / 4)
      << "T5: relative_buckets=" << c.relative_buckets
      << ", relative_max_distance=" << c.relative_max_distance
      << "; expected at least 4 buckets and a distance beyond the exact ones";
  TESSEL_CHECK(!dist::MultiAxisTensorParallel() && !d.all_to_all_sequence_parallel && !d.context_parallel &&
               !d.sequence_parallel)
      << "T5: supports the 1d tensor-parallel mode without sequence parallelism";
  return c;
}
}  // namespace

Tensor RelativePositionBuckets(int64_t query_length, int64_t key_length, bool bidirectional, int64_t buckets,
                               int64_t max_distance) {
  std::vector<int64_t> ids(static_cast<size_t>(query_length * key_length));
  const int64_t half = bidirectional ? buckets / 2 : buckets, exact = half / 2;
  // As Hugging Face computes it: the log in f32, truncated toward zero.
  const float span =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(exact)));
  for (int64_t i = 0; i < query_length; ++i)
    for (int64_t j = 0; j < key_length; ++j) {
      int64_t distance = j - i, bucket = 0;
      if (bidirectional) {
        if (distance > 0) bucket += half;
        distance = std::abs(distance);
      } else {
        distance = -std::min<int64_t>(distance, 0);
      }
      if (distance < exact) {
        bucket += distance;
      } else {
        const float scaled = std::log(static_cast<float>(distance) / static_cast<float>(exact)) / span *
                             static_cast<float>(half - exact);
        bucket += std::min<int64_t>(exact + static_cast<int64_t>(scaled), half - 1);
      }
      ids[static_cast<size_t>(i * key_length + j)] = bucket;
    }
  return Tensor::FromVector<int64_t>(ids, {query_length, key_length});
}

T5Attention::T5Attention(const T5Config& c, int64_t layer_idx, bool cross, bool with_relative_bias)
    : config_(CheckT5(c)), cross_(cross), head_dim_(c.kv_size() / c.heads) {
  const uint64_t seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + (cross ? 50 : 0);
  auto column = [&](int64_t out, uint64_t s) {
    return std::make_unique<layers::Linear>(c.hidden, out,
                                            layers::LinearOptions{.parallel = layers::Parallel::kCol,
                                                                  .bias = false,
                                                                  .layer_idx = layer_idx,
                                                                  .seed = s,
                                                                  .init_std = c.init_std});
  };
  if (cross) {
    q_ = column(c.kv_size(), seed);
    kv_ = column(2 * c.kv_size(), seed + 1);
    RegisterModule("q", *q_);
    RegisterModule("kv", *kv_);
  } else {
    qkv_ = column(3 * c.kv_size(), seed);
    RegisterModule("qkv", *qkv_);
  }
  o_ = std::make_unique<layers::Linear>(c.kv_size(), c.hidden,
                                        layers::LinearOptions{.parallel = layers::Parallel::kRow,
                                                              .bias = false,
                                                              .layer_idx = layer_idx,
                                                              .seed = seed + 2,
                                                              .init_std = c.init_std});
  RegisterModule("o", *o_);
  if (with_relative_bias) {
    NoGradGuard no_grad;
    const Shape shape({c.relative_buckets, c.heads});
    relative_attention_bias = fn::mul_scalar(
        randn(shape, dist::GetLayerPlacement(layer_idx), dist::GetParameterNdSbp(shape, S(1)), seed + 3),
        c.init_std);
    relative_attention_bias.set_requires_grad(true);
    RegisterParameter("relative_attention_bias", relative_attention_bias);
  }
}

Tensor T5Attention::PositionBias(int64_t query_length, int64_t key_length, bool bidirectional) const {
  TESSEL_CHECK(relative_attention_bias.defined())
      << "T5Attention: this layer holds no relative-position table";
  const Placement& p = relative_attention_bias.placement();
  const Tensor ids = RelativePositionBuckets(query_length, key_length, bidirectional,
                                             config_.relative_buckets, config_.relative_max_distance);
  // [s, t] ids -> [s, t, heads] (split on the heads over tp, as the table)
  // -> [1, heads, s, t].
  const Tensor looked_up = fn::embedding(layers::ForCompute(relative_attention_bias),
                                         FromLocal(ids, p, dist::GetNdSbp({B(), B()}), ids.shape()));
  return fn::reshape(fn::permute(looked_up, {2, 0, 1}), {1, config_.heads, query_length, key_length});
}

Tensor T5Attention::operator()(const Tensor& x, const Tensor& memory, const Tensor& bias, const Tensor& mask,
                               bool causal, const Tensor& residual) const {
  const int64_t b = x.shape()[0], s = x.shape()[1], heads = config_.heads, hd = head_dim_;
  Tensor q, k, v;  // [b, heads, length, hd]
  if (cross_) {
    const int64_t t = memory.shape()[1];
    q = fn::permute(fn::reshape((*q_)(x), {b, s, heads, hd}), {0, 2, 1, 3});
    const Tensor both = fn::reshape((*kv_)(memory), {b, t, heads, 2 * hd});
    k = fn::permute(fn::slice(both, 3, 0, hd), {0, 2, 1, 3});
    v = fn::permute(fn::slice(both, 3, hd, 2 * hd), {0, 2, 1, 3});
  } else {
    const std::vector<Tensor> parts = fn::split_qkv(fn::reshape((*qkv_)(x), {b, s, heads, 3 * hd}));
    q = parts[0];
    k = parts[1];
    v = parts[2];
  }
  // T5 does not scale the scores; the position bias is added to them.
  Tensor scores = fn::matmul(q, k, false, true);
  if (bias.defined()) scores = fn::add(scores, bias);
  const Tensor ctx = fn::matmul(fn::scale_mask_softmax(scores, mask, 1.0, causal), v);
  return (*o_)(fn::reshape(fn::permute(ctx, {0, 2, 1, 3}), {b, s, heads * hd}),
               layers::LinearActivation::kNone, residual);
}

T5FeedForward::T5FeedForward(const T5Config& c, int64_t layer_idx)
    : wi(c.hidden, c.gated_gelu ? 2 * c.ffn_size() : c.ffn_size(),
         {.parallel = layers::Parallel::kCol,
          .bias = false,
          .layer_idx = layer_idx,
          .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + 10,
          .init_std = c.init_std}),
      wo(c.ffn_size(), c.hidden,
         {.parallel = layers::Parallel::kRow,
          .bias = false,
          .layer_idx = layer_idx,
          .seed = c.seed + 100 * static_cast<uint64_t>(layer_idx + 1) + 11,
          .init_std = c.init_std}),
      ffn_(c.ffn_size()),
      gated_(c.gated_gelu) {
  RegisterModule("wi", wi);
  RegisterModule("wo", wo);
}

Tensor T5FeedForward::operator()(const Tensor& x, const Tensor& residual) const {
  if (!gated_) return wo(fn::relu(wi(x)), layers::LinearActivation::kNone, residual);
  // [..., ffn, 2]: the GELU gate and the linear part of each inner feature.
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = ffn_;
  std::vector<int64_t> pairs = dims;
  pairs.push_back(2);
  const Tensor both = fn::reshape(wi(x), Shape(pairs));
  const int64_t last = static_cast<int64_t>(pairs.size()) - 1;
  const Tensor gate = fn::reshape(fn::slice(both, last, 0, 1), Shape(dims));
  const Tensor linear = fn::reshape(fn::slice(both, last, 1, 2), Shape(dims));
  return wo(fn::mul(fn::gelu_tanh(gate), linear), layers::LinearActivation::kNone, residual);
}

T5Block::T5Block(const T5Config& c, int64_t layer_idx, bool decoder, bool with_relative_bias)
    : self_norm(c.hidden, c.layernorm_epsilon, layer_idx),
      self_attention(c, layer_idx, /*cross=*/false, with_relative_bias),
      ff_norm(c.hidden, c.layernorm_epsilon, layer_idx),
      ff(c, layer_idx),
      layer_idx_(layer_idx),
      decoder_(decoder),
      activation_checkpoint_(c.activation_checkpoint) {
  RegisterModule("self_norm", self_norm);
  RegisterModule("self_attention", self_attention);
  if (decoder) {
    cross_norm = std::make_unique<layers::RMSNorm>(c.hidden, c.layernorm_epsilon, layer_idx);
    cross_attention = std::make_unique<T5Attention>(c, layer_idx, /*cross=*/true, false);
    RegisterModule("cross_norm", *cross_norm);
    RegisterModule("cross_attention", *cross_attention);
  }
  RegisterModule("ff_norm", ff_norm);
  RegisterModule("ff", ff);
}

Tensor T5Block::operator()(const Tensor& x_in, const Tensor& bias, const Tensor& mask, const Tensor& memory,
                           const Tensor& memory_mask) const {
  LayerScope layer(layer_idx_);  // a trace tags this layer's ops (and their gradients) with it
  const Placement& p = self_norm.weight.placement();
  Tensor x = layers::ToActivations(x_in, p);  // move to this layer's stage
  const Tensor self_bias = layers::OnPlacement(bias, p), self_mask = layers::OnPlacement(mask, p);
  const Tensor encoded = decoder_ ? layers::ToActivations(memory, p) : Tensor();
  const Tensor encoded_mask = decoder_ ? layers::OnPlacement(memory_mask, p) : Tensor();
  std::optional<RecomputeScope> checkpoint;  // not around the moves: recomputing them would communicate again
  if (activation_checkpoint_) checkpoint.emplace();
  x = self_attention(self_norm(x), Tensor(), self_bias, self_mask, /*causal=*/decoder_, x);
  if (decoder_)
    x = (*cross_attention)((*cross_norm)(x), encoded, Tensor(), encoded_mask, /*causal=*/false, x);
  return ff(ff_norm(x), x);
}

T5::T5(const T5Config& c)
    : config_(CheckT5(c)),
      padded_vocab_(layers::PaddedVocabSizeLogged("T5", c.vocab_size, c.make_vocab_size_divisible_by)),
      shared_(padded_vocab_, c.hidden, {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std}),
      encoder_norm_(c.hidden, c.layernorm_epsilon, c.encoder_layers - 1),
      decoder_norm_(c.hidden, c.layernorm_epsilon, -1) {
  RegisterModule("shared", shared_);
  for (int64_t i = 0; i < c.encoder_layers; ++i) {
    encoder_.push_back(std::make_unique<T5Block>(c, i, /*decoder=*/false, /*with_relative_bias=*/i == 0));
    RegisterModule(std::string("encoder").append(std::to_string(i)), *encoder_.back());
  }
  RegisterModule("encoder_norm", encoder_norm_);
  for (int64_t i = 0; i < c.decoder_layers; ++i) {
    decoder_.push_back(
        std::make_unique<T5Block>(c, c.encoder_layers + i, /*decoder=*/true, /*with_relative_bias=*/i == 0));
    RegisterModule(std::string("decoder").append(std::to_string(i)), *decoder_.back());
  }
  RegisterModule("decoder_norm", decoder_norm_);
  if (!c.tie_word_embeddings) {
    lm_head_ = std::make_unique<layers::VocabEmbedding>(
        padded_vocab_, c.hidden,
        layers::EmbeddingOptions{.layer_idx = -1, .seed = c.seed + 1, .init_std = c.init_std});
    RegisterModule("lm_head", *lm_head_);
  }
}

Tensor T5::Logits(const Tensor& input_ids, const Tensor& decoder_input_ids,
                  const Tensor& attention_mask) const {
  const int64_t b = input_ids.shape()[0], s = input_ids.shape()[1], t = decoder_input_ids.shape()[1];
  TESSEL_CHECK(decoder_input_ids.shape()[0] == b)
      << "T5: decoder_input_ids " << decoder_input_ids.shape() << " for input_ids " << input_ids.shape()
      << "; expected the same batch";
  TESSEL_CHECK(!attention_mask.defined() || attention_mask.shape() == input_ids.shape())
      << "T5: attention_mask of shape " << attention_mask.shape() << "; expected the input_ids' shape "
      << input_ids.shape();
  // [b, s] -> [b, 1, 1, s]: a padded encoder token is hidden from every
  // query of its row, in both stacks.
  const Tensor mask = attention_mask.defined() ? fn::reshape(attention_mask, {b, 1, 1, s}) : Tensor();
  Tensor h = shared_(input_ids);
  const Tensor encoder_bias = encoder_.front()->self_attention.PositionBias(s, s, /*bidirectional=*/true);
  for (const auto& block : encoder_) h = (*block)(h, encoder_bias, mask, Tensor(), Tensor());
  const Tensor memory = encoder_norm_(h);
  Tensor d = shared_(decoder_input_ids);
  const Tensor decoder_bias = decoder_.front()->self_attention.PositionBias(t, t, /*bidirectional=*/false);
  // The encoder's output (and mask) travel once to each decoder stage,
  // with its first layer there, not once per layer.
  Tensor memory_here, mask_here;
  for (const auto& block : decoder_) {
    const Placement& p = block->self_norm.weight.placement();
    if (!memory_here.defined() || memory_here.placement() != p) {
      LayerScope layer(block->layer_idx());
      memory_here = layers::ToActivations(memory, p);
      mask_here = layers::OnPlacement(mask, p);
    }
    d = (*block)(d, decoder_bias, Tensor(), memory_here, mask_here);
  }
  d = decoder_norm_(d);
  // Tied to the token table, the hidden states are scaled first (Mesh
  // TensorFlow's T5, and Hugging Face's).
  if (!lm_head_) d = fn::mul_scalar(d, 1.0 / std::sqrt(static_cast<double>(config_.hidden)));
  const Tensor& table = lm_head_ ? lm_head_->weight : shared_.weight;
  return layers::MaskPaddedLogits(layers::LMLogits(d, layers::ForCompute(table)), config_.vocab_size);
}

Tensor T5::Loss(const Tensor& input_ids, const Tensor& decoder_input_ids, const Tensor& labels,
                const Tensor& attention_mask) const {
  return layers::ParallelCrossEntropyLoss(Logits(input_ids, decoder_input_ids, attention_mask), labels);
}

std::vector<int64_t> T5::ShiftRight(const std::vector<int64_t>& labels, int64_t length) {
  TESSEL_CHECK(length > 0 && labels.size() % static_cast<size_t>(length) == 0)
      << "T5::ShiftRight: " << labels.size() << " labels are not rows of " << length;
  std::vector<int64_t> shifted(labels.size());
  for (size_t row = 0; row < labels.size(); row += static_cast<size_t>(length)) {
    shifted[row] = 0;  // the decoder start token
    for (int64_t i = 1; i < length; ++i) {
      const int64_t previous = labels[row + static_cast<size_t>(i) - 1];
      shifted[row + static_cast<size_t>(i)] = previous == -100 ? 0 : previous;
    }
  }
  return shifted;
}

}  // namespace tessel::models
