// The zoo's models as a training config describes them: what tessel-train
// builds and what tessel-plan plans, from one place.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "layers/transformer.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/t5.h"
#include "zoo/config.pb.h"

namespace tessel::train {

// model.hidden_act as the layers' activation.
layers::Activation HiddenActivation(const config::ModelConfig& m);

// The GPT of a resolved config (model.*, train.seed,
// train.activation_checkpoint).
models::GPTConfig GptConfigOf(const config::Config& c);
// The Llama of a resolved config (model.*, with layernorm_epsilon as the
// RMSNorm's epsilon; train.seed, train.activation_checkpoint).
models::LlamaConfig LlamaConfigOf(const config::Config& c);
// The T5 of a resolved config (model.*: hidden_layers the encoder's,
// num_decoder_layers the decoder's, hidden_act its feed-forward;
// train.seed).
models::T5Config T5ConfigOf(const config::Config& c);

// A causal language model of the zoo (model.arch gpt2 or llama), as the
// trainer, tessel-generate and evaluation use it: the module, its loss and
// logits, and the parameters whose rows past the vocabulary are padding.
struct CausalLM {
  std::unique_ptr<nn::Module> module;
  // Mean next-token cross-entropy of ids [batch, seq] against labels.
  std::function<Tensor(const Tensor& ids, const Tensor& labels)> loss;
  // ids [batch, seq] -> logits [batch, seq, padded vocabulary] (split on it).
  std::function<Tensor(const Tensor& ids)> logits;
  // Parameter name (as NamedParameters gives it) -> the real vocabulary.
  std::map<std::string, int64_t> padded_rows;
  // Model FLOPs of the forward pass per token of a model.max_seq_length
  // sequence (2 per multiply-add; the matmuls and attention's two products,
  // as Megatron-LM and PaLM count them), for TFLOP/s and MFU in the log.
  double forward_flops_per_token = 0;
};
// Forward model FLOPs of one transformer layer for one token of a
// `seq`-long sequence: QKV (Llama's narrower key/value projections under
// grouped-query attention), the output projection, the MLP (Llama's three
// matrices; 2 FLOPs per multiply-add) and attention's scores and weighted
// sum over `seq` keys.
double TransformerLayerFlopsPerToken(const config::ModelConfig& m, int64_t seq);

// Builds the resolved config's GPT-2 or Llama under the current dist
// layout; throws naming model.arch for another model.
CausalLM BuildCausalLM(const config::Config& c);

}  // namespace tessel::train
