// GPT-2: token (vocab-parallel) and position embeddings, pre-LN
// transformer layers with causal attention, a final LayerNorm and logits
// tied to the token embedding; the same function as Hugging Face's
// GPT2LMHeadModel (with activation kGeluTanh, its default).
//
// A vocabulary that 128 x tp does not divide is padded up to a multiple of
// it (as Megatron does; the padding is logged): each tp rank holds an equal
// slice of the table, and the padded logits are filled with a large
// negative value, so softmax and loss never see them and the results do
// not depend on the padding or on tp.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/optimizer.h"
#include "layers/regularization.h"
#include "layers/transformer.h"

namespace tessel::models {

struct GPTConfig {
  int64_t vocab_size = 1000;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t max_seq = 32;
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  double layernorm_epsilon = 1e-5;
  double init_std = 0.02;  // of the normal every weight starts from
  uint64_t seed = 2024;
  layers::Activation activation = layers::Activation::kGelu;
  // Dropout after the embeddings, on the attention probabilities and on
  // each sublayer's output (training only; graph mode too: layers::Dropout).
  double embedding_dropout = 0, attention_dropout = 0, hidden_dropout = 0;
  // On GPUs, attention without the score matrix (layers::AttentionOptions::fused).
  bool fused_attention = true;
  // The table has a multiple of this times tp rows (0 or 1: tp only).
  int64_t make_vocab_size_divisible_by = 128;
  // Recompute each transformer layer in backward instead of keeping its
  // activations (graph mode; TransformerLayerOptions::activation_checkpoint).
  bool activation_checkpoint = false;
};

class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& config);
  // ids [batch, seq] (i64) -> logits [batch, seq, padded_vocab_size()]
  // (split on the vocabulary over tp; padded columns hold kMaskedLogit).
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
  static constexpr double kMaskedLogit = layers::kMaskedLogit;

 private:
  GPTConfig config_;
  int64_t padded_vocab_;
  layers::VocabEmbedding wte_;
  layers::Embedding wpe_;
  mutable layers::Dropout embedding_dropout_;  // its mask counter advances per call
  std::vector<std::unique_ptr<layers::TransformerLayer>> blocks_;
  layers::LayerNorm ln_f_;
};

using layers::PaddedVocabSize;

// One training step on batch {"ids", "labels"}: the mean loss, backward,
// gradients clipped to norm 1 (ops only, so a graph can capture it), an
// AdamW update. Returns {"loss", "grad_norm"}. What train_gpt --graph
// captures and tessel-plan compiles.
std::map<std::string, Tensor> TrainStep(const GPT& gpt, const optim::NamedParams& params, optim::AdamW& adamw,
                                        const std::map<std::string, Tensor>& batch);

}  // namespace tessel::models
