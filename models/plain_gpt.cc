#include "models/plain_gpt.h"

#include "core/error.h"
#include "ops/functional.h"

namespace tessel::models {

PlainGPT::PlainGPT(const PlainGPTConfig& c)
    : config_(c),
      wte_(c.vocab_size, c.hidden, c.seed, c.init_std),
      wpe_(c.max_seq, c.hidden, c.seed + 1, c.init_std),
      ln_f_(c.hidden, c.layernorm_epsilon) {
  RegisterModule("wte", wte_);
  RegisterModule("wpe", wpe_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::plain::Block>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden, /*causal=*/true,
        c.seed + 100 * static_cast<uint64_t>(i + 1), c.layernorm_epsilon, c.init_std));
    RegisterModule("h" + std::to_string(i), *blocks_.back());
  }
  RegisterModule("ln_f", ln_f_);
}

Tensor PlainGPT::Logits(const Tensor& ids) const {
  TESSEL_CHECK(ids.ndim() == 2 && ids.dtype() == DType::kInt64)
      << "PlainGPT: ids of shape " << ids.shape() << " (" << DTypeName(ids.dtype())
      << "); expected i64 [batch, seq]";
  const int64_t seq = ids.shape()[1];
  TESSEL_CHECK(seq <= config_.max_seq)
      << "PlainGPT: sequence of " << seq << " tokens exceeds max_seq=" << config_.max_seq;
  std::vector<int64_t> range(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) range[static_cast<size_t>(i)] = i;
  Tensor h = fn::add(wte_(ids), wpe_(Tensor::FromVector<int64_t>(range, {seq})));
  for (const auto& block : blocks_) h = (*block)(h);
  return fn::matmul(ln_f_(h), wte_.weight, false, true);
}

Tensor PlainGPT::Loss(const std::map<std::string, Tensor>& inputs) const {
  const Tensor& ids = inputs.at("ids");
  const Tensor& labels = inputs.at("labels");
  TESSEL_CHECK(labels.shape() == ids.shape())
      << "PlainGPT: labels of shape " << labels.shape() << "; expected the ids' shape " << ids.shape();
  const Tensor logits = Logits(ids);
  const int64_t rows = ids.shape()[0] * ids.shape()[1];
  return fn::cross_entropy(fn::reshape(logits, {rows, config_.vocab_size}), fn::reshape(labels, {rows}));
}

}  // namespace tessel::models
