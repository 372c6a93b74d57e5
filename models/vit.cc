#include "models/vit.h"

#include "core/error.h"
#include "graph/autograd.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::models {

namespace {
int64_t PatchCount(const ViTConfig& c) {
  TESSEL_CHECK(c.patch_size > 0 && c.image_size > 0 && c.image_size % c.patch_size == 0)
      << "ViT: image_size=" << c.image_size
      << " is not a whole number of patches of patch_size=" << c.patch_size;
  TESSEL_CHECK(c.num_classes > 0 && c.num_channels > 0)
      << "ViT: num_classes=" << c.num_classes << ", num_channels=" << c.num_channels
      << "; expected positive counts";
  const int64_t side = c.image_size / c.patch_size;
  return side * side;
}
}  // namespace

ViT::ViT(const ViTConfig& c)
    : config_(c),
      num_patches_(PatchCount(c)),
      patch_embedding_(c.num_channels, c.hidden, c.patch_size, /*layer_idx=*/0, c.seed, c.init_std),
      embedding_dropout_(c.embedding_dropout, c.seed + 2),
      ln_f_(c.hidden, c.layernorm_epsilon, -1),
      head_(c.hidden, c.num_classes,
            {.parallel = layers::Parallel::kData,
             .layer_idx = -1,
             .seed = c.seed + 3,
             .init_std = c.init_std}) {
  {
    NoGradGuard no_grad;
    const Placement first = dist::GetLayerPlacement(0);
    const Shape cls({c.hidden}), positions({num_patches_ + 1, c.hidden});
    cls_token_ = fn::mul_scalar(randn(cls, first, dist::GetParameterNdSbp(cls, B()), c.seed + 4), c.init_std);
    position_embeddings_ = fn::mul_scalar(
        randn(positions, first, dist::GetParameterNdSbp(positions, B()), c.seed + 5), c.init_std);
  }
  RegisterModule("patch_embedding", patch_embedding_);
  RegisterParameter("cls_token", cls_token_);
  RegisterParameter("position_embeddings", position_embeddings_);
  RegisterModule("embedding_dropout", embedding_dropout_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::TransformerLayer>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden,
        layers::TransformerLayerOptions{.layer_idx = i,
                                        .causal = false,
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
  RegisterModule("head", head_);
}

Tensor ViT::Logits(const Tensor& images) const {
  const Shape& s = images.shape();
  TESSEL_CHECK(s.ndim() == 4 && s[1] == config_.num_channels && s[2] == config_.image_size &&
               s[3] == config_.image_size)
      << "ViT: images of shape " << s << "; expected [batch, " << config_.num_channels << ", "
      << config_.image_size << ", " << config_.image_size << "]";
  const int64_t batch = s[0], hidden = config_.hidden;
  Tensor patches = patch_embedding_(images);  // [batch, patches, hidden], hidden layout
  // The class token in front of every image's patches, in the same layout.
  const Tensor cls =
      ApplyOp("expand", {layers::ForCompute(cls_token_)},
              {{"shape", std::vector<int64_t>{batch, 1, hidden}}, {"axes", std::vector<int64_t>{0, 1}}})
          .at(0)
          .to_global(patches.placement(), patches.nd_sbp());
  Tensor h =
      embedding_dropout_(fn::add(fn::concat({cls, patches}, 1), layers::ForCompute(position_embeddings_)));
  for (const auto& block : blocks_) h = (*block)(h);
  // Only the class token feeds the head (LayerNorm is per token, so
  // normalising it alone equals normalising the sequence first).
  return head_(ln_f_(fn::reshape(fn::slice(h, 1, 0, 1), {batch, hidden})));
}

Tensor ViT::Loss(const Tensor& images, const Tensor& labels) const {
  const Tensor logits = Logits(images);
  return fn::cross_entropy(logits, layers::ToHidden(labels, logits.placement()));
}

std::pair<Tensor, Tensor> ViT::LossSumAndCorrect(const Tensor& images, const Tensor& labels) const {
  const Tensor logits = Logits(images);
  const Tensor l = layers::ToHidden(labels, logits.placement());
  const Tensor loss_sum = fn::sum(fn::cross_entropy_rows(logits, l), {0});
  // 1 where a logit is its row's largest; picked at the label (0 for -100).
  const Tensor top = fn::cast(fn::equal(logits, fn::max(logits, {1}, true)), DType::kFloat32);
  return {loss_sum, fn::sum(fn::pick(top, l), {0})};
}

}  // namespace tessel::models
