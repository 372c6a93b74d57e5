#include "models/gpt.h"

#include <glog/logging.h>

#include <algorithm>

#include "core/error.h"
#include "layers/dist.h"
#include "ops/functional.h"

namespace tessel::models {

int64_t PaddedVocabSize(int64_t vocab_size, int64_t multiple, int64_t tp) {
  TESSEL_CHECK(vocab_size > 0) << "GPT: vocab_size=" << vocab_size << "; expected a positive size";
  const int64_t unit = std::max<int64_t>(multiple, 1) * tp;
  return (vocab_size + unit - 1) / unit * unit;
}

namespace {
int64_t PaddedVocabLogged(const GPTConfig& c) {
  const int64_t tp = dist::GetConfig().tensor_parallel_size;
  const int64_t padded = PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, tp);
  if (padded != c.vocab_size && dist::Rank() == 0)
    LOG(INFO) << "GPT: vocabulary of " << c.vocab_size << " padded to " << padded << " rows (a multiple of "
              << std::max<int64_t>(c.make_vocab_size_divisible_by, 1) << " x tp " << tp
              << "); the padded logits are masked out";
  return padded;
}
}  // namespace

GPT::GPT(const GPTConfig& c)
    : config_(c),
      padded_vocab_(PaddedVocabLogged(c)),
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
                                        .hidden_dropout = c.hidden_dropout}));
    RegisterModule(std::string("h").append(std::to_string(i)), *blocks_.back());
  }
  RegisterModule("ln_f", ln_f_);
}

Tensor GPT::Logits(const Tensor& ids, const Tensor& position_ids, const Tensor& attention_mask) const {
  const int64_t batch = ids.shape()[0], seq = ids.shape()[1];
  TESSEL_CHECK(seq <= config_.max_seq)
      << "GPT: sequence of " << seq << " tokens exceeds max_seq=" << config_.max_seq;
  for (const Tensor* t : {&position_ids, &attention_mask})
    TESSEL_CHECK(!t->defined() || t->shape() == ids.shape())
        << "GPT: " << (t == &position_ids ? "position_ids" : "attention_mask") << " of shape " << t->shape()
        << "; expected the ids' shape " << ids.shape();
  Tensor positions = position_ids;
  if (!positions.defined()) {
    std::vector<int64_t> range(seq);
    for (int64_t i = 0; i < seq; ++i) range[i] = i;
    positions = Tensor::FromVector<int64_t>(range, {seq});
  }
  Tensor h = embedding_dropout_(fn::add(wte_(ids), wpe_(positions)));
  // [batch, seq] -> [batch, 1, 1, seq]: a padded key is hidden from every
  // query of its row and every head.
  const Tensor mask = attention_mask.defined() ? fn::reshape(attention_mask, {batch, 1, 1, seq}) : Tensor();
  for (const auto& block : blocks_) h = (*block)(h, mask);
  Tensor logits = layers::LMLogits(ln_f_(h), wte_.weight);
  if (padded_vocab_ == config_.vocab_size) return logits;
  std::vector<bool> padding(padded_vocab_, false);
  std::fill(padding.begin() + config_.vocab_size, padding.end(), true);
  // Replicated from each rank's full copy, then sliced like the logits.
  const Placement& p = logits.placement();
  Tensor padded = Tensor::FromVector<bool>(padding, {padded_vocab_})
                      .to_global(p, dist::GetNdSbp({B(), B()}))
                      .to_global(p, dist::GetNdSbp({B(), S(0)}));
  return fn::masked_fill(logits, padded, kMaskedLogit);
}

Tensor GPT::Loss(const Tensor& ids, const Tensor& labels, const Tensor& position_ids,
                 const Tensor& attention_mask) const {
  return layers::ParallelCrossEntropyLoss(Logits(ids, position_ids, attention_mask), labels);
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
