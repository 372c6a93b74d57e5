#include "models/gpt.h"

#include "core/error.h"
#include "ops/functional.h"

namespace tessel::models {

GPT::GPT(const GPTConfig& c)
    : config_(c),
      wte_(c.vocab_size, c.hidden, {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std}),
      wpe_(c.max_seq, c.hidden, {.layer_idx = 0, .seed = c.seed + 1, .init_std = c.init_std}),
      ln_f_(c.hidden, c.layernorm_epsilon, -1) {
  RegisterModule("wte", wte_);
  RegisterModule("wpe", wpe_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::TransformerLayer>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden,
        layers::TransformerLayerOptions{.layer_idx = i,
                                        .seed = c.seed + 100 * static_cast<uint64_t>(i + 1),
                                        .activation_checkpoint = c.activation_checkpoint,
                                        .layernorm_epsilon = c.layernorm_epsilon,
                                        .init_std = c.init_std}));
    RegisterModule(std::string("h").append(std::to_string(i)), *blocks_.back());
  }
  RegisterModule("ln_f", ln_f_);
}

Tensor GPT::Logits(const Tensor& ids) const {
  const int64_t seq = ids.shape()[1];
  TESSEL_CHECK(seq <= config_.max_seq)
      << "GPT: sequence of " << seq << " tokens exceeds max_seq=" << config_.max_seq;
  std::vector<int64_t> positions(seq);
  for (int64_t i = 0; i < seq; ++i) positions[i] = i;
  Tensor h = fn::add(wte_(ids), wpe_(Tensor::FromVector<int64_t>(positions, {seq})));
  for (const auto& block : blocks_) h = (*block)(h);
  return layers::LMLogits(ln_f_(h), wte_.weight);
}

Tensor GPT::Loss(const Tensor& ids, const Tensor& labels) const {
  return layers::ParallelCrossEntropyLoss(Logits(ids), labels);
}

std::map<std::string, Tensor> TrainStep(const GPT& gpt, const optim::NamedParams& params, optim::AdamW& adamw,
                                        const std::map<std::string, Tensor>& batch) {
  Tensor loss = gpt.Loss(batch.at("ids"), batch.at("labels"));
  loss.backward();
  Tensor grad_norm = optim::ClipGradNormTensor(params, 1.0);
  adamw.Step();
  return {{"loss", loss}, {"grad_norm", grad_norm}};
}

}  // namespace tessel::models
