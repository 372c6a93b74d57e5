// GPT-2 written for one device from layers/plain.h: no placement, layout or
// stage anywhere in it. parallel::parallelize trains it over many ranks
// under a policy (data, tensor, pipeline parallel or a mix) and gives the
// losses it gives alone. Inputs: "ids" and "labels", i64 [batch, seq].
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/plain.h"

namespace tessel::models {

struct PlainGPTConfig {
  int64_t vocab_size = 256;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t max_seq = 32;
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  double layernorm_epsilon = 1e-5;
  double init_std = 0.02;
  uint64_t seed = 2024;
};

class PlainGPT : public nn::LossModule {
 public:
  explicit PlainGPT(const PlainGPTConfig& config);
  // [batch, seq, vocab]; the output projection is the token table (tied).
  Tensor Logits(const Tensor& ids) const;
  // Mean cross-entropy of next tokens ("ids", "labels").
  Tensor Loss(const std::map<std::string, Tensor>& inputs) const override;
  const PlainGPTConfig& config() const { return config_; }

 private:
  PlainGPTConfig config_;
  layers::plain::Embedding wte_, wpe_;
  std::vector<std::unique_ptr<layers::plain::Block>> blocks_;
  layers::plain::LayerNorm ln_f_;
};

}  // namespace tessel::models
