// T5: an encoder-decoder transformer, the same function as Hugging Face's
// T5ForConditionalGeneration. Pre-norm layers with T5's layer norm (an
// RMSNorm without a bias), no biases, unscaled attention scores plus a
// learned bias per head and relative-position bucket (computed in each
// stack's first layer and shared by the stack's layers: bidirectional in
// the encoder, causal in the decoder), decoder layers with cross-attention
// to the encoder's output, and a gated-GELU feed-forward (T5 v1.1) or a
// ReLU one (the original T5). The token table is shared by both stacks;
// the output table is its own ([vocab, hidden], v1.1) or the shared one
// with the hidden states scaled by hidden^-1/2 (the original).
//
// Tensor parallelism is Megatron's: each attention's q|k|v (self) or k|v
// (cross) is one column-parallel projection laid out head-major, so a
// column split hands each rank whole heads, and the relative-position
// table is split on its heads alike; the output and the feed-forward's
// down projections are row-parallel; the gated feed-forward's two inner
// projections are one, interleaved per feature. Layers are numbered
// encoder first (0 .. encoder_layers - 1), then decoder, and placed on
// pipeline stages by that number: the encoder's output travels to the
// decoder's stages for cross-attention.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/rms_norm.h"

namespace tessel::models {

struct T5Config {
  int64_t vocab_size = 1000;
  int64_t hidden = 64;  // d_model
  int64_t heads = 4;
  int64_t head_dim = 0;    // d_kv; 0: hidden / heads
  int64_t ffn_hidden = 0;  // d_ff; 0: 4 x hidden
  int64_t encoder_layers = 2;
  int64_t decoder_layers = 2;
  int64_t relative_buckets = 32;
  int64_t relative_max_distance = 128;
  double layernorm_epsilon = 1e-6;
  bool gated_gelu = true;  // T5 v1.1's gated-GELU feed-forward; false: the original's ReLU
  bool tie_word_embeddings = false;
  double init_std = 0.02;
  uint64_t seed = 2024;
  int64_t make_vocab_size_divisible_by = 128;
  bool activation_checkpoint = false;  // recompute each layer in backward (graph mode)

  int64_t kv_size() const { return heads * (head_dim ? head_dim : hidden / heads); }
  int64_t ffn_size() const { return ffn_hidden ? ffn_hidden : 4 * hidden; }
};

// T5's relative-position buckets (Hugging Face's _relative_position_bucket)
// of every (query, key) pair: [query_length, key_length] ids.
Tensor RelativePositionBuckets(int64_t query_length, int64_t key_length, bool bidirectional, int64_t buckets,
                               int64_t max_distance);

class T5Attention : public nn::Module {
 public:
  // Self-attention (q|k|v from one input) or cross-attention (q from the
  // decoder, k|v from the encoder's output); with_relative_bias: this
  // layer holds its stack's relative-position table.
  T5Attention(const T5Config& config, int64_t layer_idx, bool cross, bool with_relative_bias);
  // x [b, s, hidden]; memory (cross-attention) [b, t, hidden]; bias
  // [1, heads, s, keys] added to the scores (undefined: none); mask bool,
  // broadcast to [b, heads, s, keys] (false: hidden); causal for the
  // decoder's self-attention; residual added in the output projection.
  Tensor operator()(const Tensor& x, const Tensor& memory, const Tensor& bias, const Tensor& mask,
                    bool causal, const Tensor& residual) const;
  // The stack's position bias [1, heads, s, t] from this layer's table.
  Tensor PositionBias(int64_t query_length, int64_t key_length, bool bidirectional) const;

  Tensor relative_attention_bias;  // [buckets, heads] (undefined without)

 private:
  // Self-attention: qkv, head-major [head][q|k|v][head_dim]; cross: q, and
  // kv head-major [head][k|v][head_dim].
  std::unique_ptr<layers::Linear> qkv_, q_, kv_, o_;
  T5Config config_;
  bool cross_;
  int64_t head_dim_;
};

class T5FeedForward : public nn::Module {
 public:
  T5FeedForward(const T5Config& config, int64_t layer_idx);
  Tensor operator()(const Tensor& x, const Tensor& residual) const;
  layers::Linear wi, wo;  // wi: [gate | linear] interleaved per feature when gated

 private:
  int64_t ffn_;
  bool gated_;
};

class T5Block : public nn::Module {
 public:
  T5Block(const T5Config& config, int64_t layer_idx, bool decoder, bool with_relative_bias);
  // x [b, s, hidden]; bias and mask for the self-attention; memory and
  // memory_mask (decoder) for the cross-attention.
  Tensor operator()(const Tensor& x, const Tensor& bias, const Tensor& mask, const Tensor& memory,
                    const Tensor& memory_mask) const;
  layers::RMSNorm self_norm;
  T5Attention self_attention;
  std::unique_ptr<layers::RMSNorm> cross_norm;
  std::unique_ptr<T5Attention> cross_attention;
  layers::RMSNorm ff_norm;
  T5FeedForward ff;
  int64_t layer_idx() const { return layer_idx_; }

 private:
  int64_t layer_idx_;
  bool decoder_;
  bool activation_checkpoint_;
};

class T5 : public nn::Module {
 public:
  explicit T5(const T5Config& config);
  // input_ids [b, s] and decoder_input_ids [b, t] (i64) -> logits [b, t,
  // padded vocabulary] split on the vocabulary over tp (padded columns
  // kMaskedLogit). attention_mask [b, s] (bool, false for padding;
  // undefined: none) hides encoder tokens from both stacks.
  Tensor Logits(const Tensor& input_ids, const Tensor& decoder_input_ids,
                const Tensor& attention_mask = Tensor()) const;
  // Mean cross-entropy of the decoder's predictions against labels [b, t]
  // (-100 ignored), the decoder reading decoder_input_ids (the labels
  // shifted right: ShiftRight).
  Tensor Loss(const Tensor& input_ids, const Tensor& decoder_input_ids, const Tensor& labels,
              const Tensor& attention_mask = Tensor()) const;
  int64_t padded_vocab_size() const { return padded_vocab_; }
  // Rows of labels [rows x length] shifted right as the decoder reads them:
  // each row starts with T5's decoder start token (its pad, 0), and an
  // ignored label (-100) reads as 0 (Hugging Face's _shift_right).
  static std::vector<int64_t> ShiftRight(const std::vector<int64_t>& labels, int64_t length);

 private:
  Tensor Decode(const Tensor& decoder_ids, const Tensor& memory, const Tensor& memory_mask) const;

  T5Config config_;
  int64_t padded_vocab_;
  layers::VocabEmbedding shared_;
  std::vector<std::unique_ptr<T5Block>> encoder_;
  layers::RMSNorm encoder_norm_;
  std::vector<std::unique_ptr<T5Block>> decoder_;
  layers::RMSNorm decoder_norm_;
  std::unique_ptr<layers::VocabEmbedding> lm_head_;  // absent when tied
};

}  // namespace tessel::models
