// GPT-2 style decoder: token (vocab-parallel) and position embeddings,
// pre-LN transformer layers with causal attention, a final LayerNorm and
// logits tied to the token embedding.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/optimizer.h"
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
  // Recompute each transformer layer in backward instead of keeping its
  // activations (graph mode; TransformerLayerOptions::activation_checkpoint).
  bool activation_checkpoint = false;
};

class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& config);
  // ids [batch, seq] (i64) -> logits [batch, seq, vocab] (split on vocab over tp).
  Tensor Logits(const Tensor& ids) const;
  // Mean next-token cross-entropy of the logits for ids against labels.
  Tensor Loss(const Tensor& ids, const Tensor& labels) const;

 private:
  GPTConfig config_;
  layers::VocabEmbedding wte_;
  layers::Embedding wpe_;
  std::vector<std::unique_ptr<layers::TransformerLayer>> blocks_;
  layers::LayerNorm ln_f_;
};

// One training step on batch {"ids", "labels"}: the mean loss, backward,
// gradients clipped to norm 1 (ops only, so a graph can capture it), an
// AdamW update. Returns {"loss", "grad_norm"}. What train_gpt --graph
// captures and tessel-plan compiles.
std::map<std::string, Tensor> TrainStep(const GPT& gpt, const optim::NamedParams& params, optim::AdamW& adamw,
                                        const std::map<std::string, Tensor>& batch);

}  // namespace tessel::models
