// ViT (Dosovitskiy et al.): the image cut into patches, each projected to
// the hidden size (a convolution with stride = kernel = patch), a learned
// class token in front, learned position embeddings, pre-LN transformer
// layers without a causal mask, a final LayerNorm and a classification
// head on the class token. The same function as Hugging Face's
// ViTForImageClassification (exact GELU and epsilon 1e-12 by default there;
// set them in the config).
//
// Under tp the attention and MLP are split as in GPT; the class token,
// position embeddings, final LayerNorm and head are replicated (a head of a
// few classes is not worth splitting), so the logits are whole on every tp
// rank. Each transformer layer has its layer_idx: the patch embedding lives
// on the first stage, the head on the last.
#pragma once

#include <memory>
#include <vector>

#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/regularization.h"
#include "layers/transformer.h"

namespace tessel::models {

struct ViTConfig {
  int64_t image_size = 8;  // height = width
  int64_t patch_size = 2;
  int64_t num_channels = 1;
  int64_t num_classes = 10;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  double layernorm_epsilon = 1e-12;
  double init_std = 0.02;
  uint64_t seed = 2024;
  layers::Activation activation = layers::Activation::kGelu;
  // Dropout after the embeddings, on the attention probabilities and on
  // each sublayer's output (training only; graph mode too: layers::Dropout).
  double embedding_dropout = 0, attention_dropout = 0, hidden_dropout = 0;
  // On GPUs, attention without the score matrix (layers::AttentionOptions::fused).
  bool fused_attention = true;
  bool activation_checkpoint = false;  // as GPTConfig's
};

class ViT : public nn::Module {
 public:
  // Throws naming the sizes if the image is not a whole number of patches.
  explicit ViT(const ViTConfig& config);
  // images [batch, channels, size, size] (f32) -> logits [batch, classes].
  Tensor Logits(const Tensor& images) const;
  // Mean cross-entropy of the logits against labels [batch] (i64; -100
  // does not count).
  Tensor Loss(const Tensor& images, const Tensor& labels) const;
  // For evaluation: the sum of the per-image losses and the number of
  // images whose largest logit is their label (f32 scalars; labels of -100
  // count in neither).
  std::pair<Tensor, Tensor> LossSumAndCorrect(const Tensor& images, const Tensor& labels) const;
  int64_t num_patches() const { return num_patches_; }

 private:
  ViTConfig config_;
  int64_t num_patches_;
  layers::PatchEmbedding patch_embedding_;
  Tensor cls_token_;            // [hidden], replicated, on the first stage
  Tensor position_embeddings_;  // [1 + patches, hidden], replicated, on the first stage
  mutable layers::Dropout embedding_dropout_;
  std::vector<std::unique_ptr<layers::TransformerLayer>> blocks_;
  layers::LayerNorm ln_f_;
  layers::Linear head_;
};

}  // namespace tessel::models
