// ViT written for one device from layers/plain.h (see plain_gpt.h): patch
// embedding, a class token, position embeddings, pre-norm blocks and a
// classifier on the class token. Inputs: "images" f32 [batch, channels,
// size, size] and "labels" i64 [batch].
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "layers/plain.h"

namespace tessel::models {

struct PlainViTConfig {
  int64_t image_size = 16;
  int64_t patch_size = 4;
  int64_t num_channels = 3;
  int64_t num_classes = 8;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  double layernorm_epsilon = 1e-5;
  double init_std = 0.02;
  uint64_t seed = 3031;
};

class PlainViT : public nn::LossModule {
 public:
  explicit PlainViT(const PlainViTConfig& config);
  Tensor Logits(const Tensor& images) const;  // [batch, classes]
  Tensor Loss(const std::map<std::string, Tensor>& inputs) const override;
  const PlainViTConfig& config() const { return config_; }

 private:
  PlainViTConfig config_;
  int64_t patches_;
  layers::plain::Linear patch_embedding_;
  Tensor cls_token_, position_embeddings_;
  std::vector<std::unique_ptr<layers::plain::Block>> blocks_;
  layers::plain::LayerNorm ln_f_;
  layers::plain::Linear head_;
};

}  // namespace tessel::models
