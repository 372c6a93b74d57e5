#include "models/plain_vit.h"

#include "core/error.h"
#include "graph/autograd.h"
#include "ops/functional.h"

namespace tessel::models {

namespace {
int64_t PatchCount(const PlainViTConfig& c) {
  TESSEL_CHECK(c.patch_size > 0 && c.image_size > 0 && c.image_size % c.patch_size == 0)
      << "PlainViT: image_size=" << c.image_size
      << " is not a whole number of patches of patch_size=" << c.patch_size;
  const int64_t side = c.image_size / c.patch_size;
  return side * side;
}
}  // namespace

PlainViT::PlainViT(const PlainViTConfig& c)
    : config_(c),
      patches_(PatchCount(c)),
      patch_embedding_(c.num_channels * c.patch_size * c.patch_size, c.hidden, c.seed, c.init_std),
      ln_f_(c.hidden, c.layernorm_epsilon),
      head_(c.hidden, c.num_classes, c.seed + 3, c.init_std) {
  {
    NoGradGuard no_grad;
    cls_token_ = fn::mul_scalar(randn({c.hidden}, c.seed + 4), c.init_std);
    position_embeddings_ = fn::mul_scalar(randn({patches_ + 1, c.hidden}, c.seed + 5), c.init_std);
  }
  RegisterModule("patch_embedding", patch_embedding_);
  RegisterParameter("cls_token", cls_token_);
  RegisterParameter("position_embeddings", position_embeddings_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::plain::Block>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden, /*causal=*/false,
        c.seed + 100 * static_cast<uint64_t>(i + 1), c.layernorm_epsilon, c.init_std));
    RegisterModule("h" + std::to_string(i), *blocks_.back());
  }
  RegisterModule("ln_f", ln_f_);
  RegisterModule("head", head_);
}

Tensor PlainViT::Logits(const Tensor& images) const {
  const Shape& s = images.shape();
  TESSEL_CHECK(s.ndim() == 4 && s[1] == config_.num_channels && s[2] == config_.image_size &&
               s[3] == config_.image_size)
      << "PlainViT: images of shape " << s << "; expected [batch, " << config_.num_channels << ", "
      << config_.image_size << ", " << config_.image_size << "]";
  const int64_t batch = s[0], hidden = config_.hidden;
  const Tensor patches = patch_embedding_(fn::patchify(images, config_.patch_size));  // [b, patches, hidden]
  const Tensor cls =
      ApplyOp("expand", {cls_token_},
              {{"shape", std::vector<int64_t>{batch, 1, hidden}}, {"axes", std::vector<int64_t>{0, 1}}})
          .at(0);
  Tensor h = fn::add(fn::concat({cls, patches}, 1), position_embeddings_);
  for (const auto& block : blocks_) h = (*block)(h);
  // Only the class token feeds the head.
  return head_(ln_f_(fn::reshape(fn::slice(h, 1, 0, 1), {batch, hidden})));
}

Tensor PlainViT::Loss(const std::map<std::string, Tensor>& inputs) const {
  const Tensor& labels = inputs.at("labels");
  const Tensor logits = Logits(inputs.at("images"));
  TESSEL_CHECK(labels.ndim() == 1 && labels.shape()[0] == logits.shape()[0])
      << "PlainViT: labels of shape " << labels.shape() << "; expected [" << logits.shape()[0] << "]";
  return fn::cross_entropy(logits, labels);
}

}  // namespace tessel::models
