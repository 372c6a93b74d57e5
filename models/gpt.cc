#include "models/gpt.h"

#include "core/error.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"

namespace tessel::models {

GPT::GPT(const GPTConfig& c)
    : config_(c),
      padded_vocab_(layers::PaddedVocabSizeLogged("GPT", c.vocab_size, c.make_vocab_size_divisible_by)),
      wte_(padded_vocab_, c.hidden, {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std}),
      wpe_(c.max_seq, c.hidden, {.layer_idx = 0, .seed = c.seed + 1, .init_std = c.init_std}),
      embedding_dropout_(c.embedding_dropout, c.seed + 2),
      ln_f_(c.hidden, c.layernorm_epsilon, -1) {
  RegisterModule("wte", wte_);
  RegisterModule("wpe", wpe_);
  RegisterModule("embedding_dropout", embedding_dropout_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::TransformerLayer>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden,
        layers::TransformerLayerOptions{.layer_idx = i,
                                        .seed = c.seed + 100 * static_cast<uint64_t>(i + 1),
                                        .activation_checkpoint = c.activation_checkpoint,
                                        .layernorm_epsilon = c.layernorm_epsilon,
                                        .init_std = c.init_std,
                                        .activation = c.activation,
                                        .attention_dropout = c.attention_dropout,
                                        .hidden_dropout = c.hidden_dropout,
                                        .fused_attention = c.fused_attention}));
    RegisterModule(std::string("h").append(std::to_string(i)), *blocks_.back());
  }
  RegisterModule("ln_f", ln_f_);
}

Tensor GPT::Logits(const Tensor& ids, const Tensor& position_ids, const Tensor& attention_mask) const {
  const int64_t batch = ids.shape()[0], seq = ids.shape()[1];
  layers::CheckTokenInputs("GPT", ids, position_ids, attention_mask, config_.max_seq);
  const Tensor positions = layers::PositionsOrRange(position_ids, seq);
  Tensor h = embedding_dropout_(fn::add(wte_(ids), wpe_(positions)));
  // [batch, seq] -> [batch, 1, 1, seq]: a padded key is hidden from every
  // query of its row and every head.
  const Tensor mask = attention_mask.defined() ? fn::reshape(attention_mask, {batch, 1, 1, seq}) : Tensor();
  for (const auto& block : blocks_) h = (*block)(h, mask);
  return layers::MaskPaddedLogits(layers::LMLogits(ln_f_(h), layers::ForCompute(wte_.weight)),
                                  config_.vocab_size);
}

Tensor GPT::Loss(const Tensor& ids, const Tensor& labels, const Tensor& position_ids,
                 const Tensor& attention_mask) const {
  return layers::ParallelCrossEntropyLoss(Logits(ids, position_ids, attention_mask), labels);
}

std::map<std::string, Tensor> TrainStep(const GPT& gpt, const optim::NamedParams& params, optim::AdamW& adamw,
                                        const std::map<std::string, Tensor>& batch) {
  Tensor loss = gpt.Loss(batch.at("ids"), batch.at("labels"));
  loss.backward();
  Tensor grad_norm = optim::ClipGradNormTensor(params, 1.0, adamw.GradientLayouts());
  adamw.Step();
  return {{"loss", loss}, {"grad_norm", grad_norm}};
}

}  // namespace tessel::models
