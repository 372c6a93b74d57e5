// Llama: a vocab-parallel token embedding, pre-norm decoder layers
// (RMSNorm, causal self-attention with rotary position embeddings and
// grouped-query attention, a SwiGLU MLP), a final RMSNorm and an untied
// output projection (or logits tied to the embedding); no biases. The same
// function as Hugging Face's LlamaForCausalLM, under the same parameter
// names but for the "model." prefix, "layers<i>" for "layers.<i>" and the
// fused projections (qkv_proj, gate_up_proj); Linear weights are stored
// [in, out], the output projection [vocab, hidden] like the embedding (split on the vocabulary over tp, so
// that checkpoints of any tp load into any other: padded rows differ).
//
// Tensor parallelism is Megatron's: q, k and v are one column-parallel
// projection laid out by key/value group ([group][its query heads | k |
// v][head_dim], as Megatron-LM lays out grouped-query attention), so a
// column split hands each rank whole groups and key/value heads
// (grouped-query attention: fewer than the query heads, each serving
// heads / kv_heads of them) must divide by tp; gate and up are one
// column-parallel projection with their columns interleaved ([ffn][gate |
// up]), so each rank holds matching halves; the output projection and the
// MLP's down projection are row-parallel. One product and one all-reduce of
// the input gradient each, as Megatron's formulas count. A vocabulary that
// 128 x tp does not divide is padded (as GPT's; the padded logits masked).
#pragma once

#include <memory>
#include <vector>

#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/rms_norm.h"
#include "ops/functional.h"

namespace tessel::models {

struct LlamaConfig {
  int64_t vocab_size = 1000;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // key/value heads; 0: heads (no grouping)
  int64_t layers = 2;
  // The MLP's inner size; 0: Llama's rule, 2/3 of 4 x hidden rounded up to
  // a multiple of 256.
  int64_t ffn_hidden = 0;
  int64_t max_seq = 32;
  double rms_norm_eps = 1e-5;
  fn::RotaryOptions rope = {};  // theta, and Llama 3's frequency scaling
  bool tie_word_embeddings = false;
  double init_std = 0.02;
  uint64_t seed = 2024;
  int64_t make_vocab_size_divisible_by = 128;
  // On GPUs in bf16/f16 without a padding mask: attention without the
  // [seq, seq] score matrix (fn::attention).
  bool fused_attention = true;
  // Recompute each decoder layer in backward (graph mode).
  bool activation_checkpoint = false;

  int64_t key_value_heads() const { return kv_heads ? kv_heads : heads; }
  int64_t ffn_size() const;
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(const LlamaConfig& config, int64_t layer_idx);
  // x [batch, seq, hidden]; positions [seq] or [batch, seq] (global, on
  // this layer's stage); mask (optional) bool [batch, 1, 1, seq], false =
  // masked; residual (optional) added in the output projection's op.
  Tensor operator()(const Tensor& x, const Tensor& positions, const Tensor& mask,
                    const Tensor& residual) const;
  layers::Linear qkv_proj, o_proj;

 private:
  int64_t heads_, kv_heads_, head_dim_;
  fn::RotaryOptions rope_;
  bool fused_;
};

class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(const LlamaConfig& config, int64_t layer_idx);
  // down(silu(gate(x)) * up(x)) + residual (optional).
  Tensor operator()(const Tensor& x, const Tensor& residual) const;
  layers::Linear gate_up_proj, down_proj;

 private:
  int64_t ffn_;
};

class LlamaDecoderLayer : public nn::Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, int64_t layer_idx);
  Tensor operator()(const Tensor& x, const Tensor& positions, const Tensor& mask) const;
  layers::RMSNorm input_layernorm;
  LlamaAttention self_attn;
  layers::RMSNorm post_attention_layernorm;
  LlamaMLP mlp;

 private:
  int64_t layer_idx_;
  bool activation_checkpoint_;
};

class Llama : public nn::Module {
 public:
  explicit Llama(const LlamaConfig& config);
  // ids [batch, seq] (i64) -> logits [batch, seq, padded_vocab_size()],
  // split on the vocabulary over tp (padded columns hold kMaskedLogit).
  // position_ids [batch, seq] (i64; undefined: 0 .. seq-1 in every row);
  // attention_mask [batch, seq] (bool, false for padding; undefined: none)
  // hides keys from every query, on top of the causal mask.
  Tensor Logits(const Tensor& ids, const Tensor& position_ids = Tensor(),
                const Tensor& attention_mask = Tensor()) const;
  // Mean next-token cross-entropy of the logits for ids against labels
  // (labels of -100 do not count).
  Tensor Loss(const Tensor& ids, const Tensor& labels, const Tensor& position_ids = Tensor(),
              const Tensor& attention_mask = Tensor()) const;
  int64_t padded_vocab_size() const { return padded_vocab_; }
  const LlamaConfig& config() const { return config_; }

 private:
  LlamaConfig config_;
  int64_t padded_vocab_;
  layers::VocabEmbedding embed_tokens_;
  std::vector<std::unique_ptr<LlamaDecoderLayer>> layers_;
  layers::RMSNorm norm_;
  // The output projection's table [padded vocab, hidden] on the last stage,
  // laid out as an embedding's; absent when tied to the embedding.
  std::unique_ptr<layers::VocabEmbedding> lm_head_;
};

}  // namespace tessel::models
