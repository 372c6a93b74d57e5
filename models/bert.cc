#include "models/bert.h"

#include "core/error.h"
#include "graph/autograd.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::models {

namespace {
Tensor Activate(const Tensor& x, layers::Activation a) {
  return a == layers::Activation::kGelu ? fn::gelu(x) : fn::gelu_tanh(x);
}
}  // namespace

Bert::Bert(const BertConfig& c)
    : config_(c),
      padded_vocab_(layers::PaddedVocabSizeLogged("BERT", c.vocab_size, c.make_vocab_size_divisible_by)),
      word_embeddings_(
          padded_vocab_, c.hidden,
          {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std, .padding_idx = c.pad_token_id}),
      position_embeddings_(c.max_seq, c.hidden, {.layer_idx = 0, .seed = c.seed + 1, .init_std = c.init_std}),
      token_type_embeddings_(c.type_vocab_size, c.hidden,
                             {.layer_idx = 0, .seed = c.seed + 2, .init_std = c.init_std}),
      embedding_ln_(c.hidden, c.layernorm_epsilon, 0),
      embedding_dropout_(c.embedding_dropout, c.seed + 3),
      pooler_(c.hidden, c.hidden, {.layer_idx = -1, .seed = c.seed + 4, .init_std = c.init_std}),
      classifier_dropout_(c.classifier_dropout, c.seed + 8) {
  TESSEL_CHECK(c.pad_token_id >= -1 && c.pad_token_id < c.vocab_size)
      << "BERT: pad_token_id " << c.pad_token_id << "; expected a token below vocab_size " << c.vocab_size
      << ", or -1 for none";
  TESSEL_CHECK(c.num_labels == 0 || c.num_labels >= 2)
      << "BERT: num_labels " << c.num_labels << "; expected 0 (pre-training heads) or at least 2 classes";
  RegisterModule("word_embeddings", word_embeddings_);
  RegisterModule("position_embeddings", position_embeddings_);
  RegisterModule("token_type_embeddings", token_type_embeddings_);
  RegisterModule("embedding_ln", embedding_ln_);
  RegisterModule("embedding_dropout", embedding_dropout_);
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks_.push_back(std::make_unique<layers::TransformerLayer>(
        c.hidden, c.heads, c.ffn_hidden ? c.ffn_hidden : 4 * c.hidden,
        layers::TransformerLayerOptions{.layer_idx = i,
                                        .pre_ln = false,
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
  RegisterModule("pooler", pooler_);
  if (c.num_labels > 0) {
    classifier_ = std::make_unique<layers::Linear>(
        c.hidden, c.num_labels,
        layers::LinearOptions{.layer_idx = -1, .seed = c.seed + 7, .init_std = c.init_std});
    RegisterModule("classifier_dropout", classifier_dropout_);
    RegisterModule("classifier", *classifier_);
    return;
  }
  mlm_transform_ = std::make_unique<layers::Linear>(
      c.hidden, c.hidden, layers::LinearOptions{.layer_idx = -1, .seed = c.seed + 5, .init_std = c.init_std});
  sentence_head_ = std::make_unique<layers::Linear>(
      c.hidden, 2, layers::LinearOptions{.layer_idx = -1, .seed = c.seed + 6, .init_std = c.init_std});
  mlm_ln_ = std::make_unique<layers::LayerNorm>(c.hidden, c.layernorm_epsilon, -1);
  {
    NoGradGuard no_grad;
    mlm_bias_ = zeros({padded_vocab_}, dist::GetLayerPlacement(-1),
                      dist::GetParameterNdSbp(Shape({padded_vocab_}), S(0)));
  }
  RegisterModule("mlm_transform", *mlm_transform_);
  RegisterModule("mlm_ln", *mlm_ln_);
  RegisterParameter("mlm_bias", mlm_bias_);
  RegisterModule("sentence_head", *sentence_head_);
}

std::pair<Tensor, Tensor> Bert::Encode(const Tensor& ids, const Tensor& token_type_ids,
                                       const Tensor& attention_mask) const {
  const int64_t batch = ids.shape()[0], seq = ids.shape()[1];
  TESSEL_CHECK(seq <= config_.max_seq)
      << "BERT: sequence of " << seq << " tokens exceeds max_seq=" << config_.max_seq;
  for (const Tensor* t : {&token_type_ids, &attention_mask})
    TESSEL_CHECK(!t->defined() || t->shape() == ids.shape())
        << "BERT: " << (t == &token_type_ids ? "token_type_ids" : "attention_mask") << " of shape "
        << t->shape() << "; expected the ids' shape " << ids.shape();
  const Tensor positions = layers::PositionsOrRange(Tensor(), seq);
  Tensor types = token_type_ids;
  if (!types.defined())
    types = Tensor::FromVector<int64_t>(std::vector<int64_t>(batch * seq, 0), {batch, seq});
  // Token types are looked up in the ids' layout (batch split over dp).
  const Tensor& type_table = token_type_embeddings_.weight;
  const Tensor type_vectors =
      fn::embedding(layers::ForCompute(type_table), layers::ToHidden(types, type_table.placement()));
  Tensor h = fn::add(fn::add(word_embeddings_(ids), position_embeddings_(positions)), type_vectors);
  h = embedding_dropout_(embedding_ln_(h));
  const Tensor mask = attention_mask.defined() ? fn::reshape(attention_mask, {batch, 1, 1, seq}) : Tensor();
  for (const auto& block : blocks_) h = (*block)(h, mask);
  const Tensor first_token = fn::reshape(fn::slice(h, 1, 0, 1), {batch, config_.hidden});
  return {h, fn::tanh(pooler_(first_token))};
}

BertOutputs Bert::Forward(const Tensor& ids, const Tensor& token_type_ids,
                          const Tensor& attention_mask) const {
  TESSEL_CHECK(config_.num_labels == 0)
      << "BERT: this model is a classifier of " << config_.num_labels
      << " classes; its outputs are ClassificationLogits, not the pre-training heads";
  const auto [h, pooled] = Encode(ids, token_type_ids, attention_mask);
  const Tensor t = (*mlm_ln_)(Activate((*mlm_transform_)(h), config_.activation));
  const Tensor logits = fn::add(layers::LMLogits(t, layers::ForCompute(word_embeddings_.weight)),
                                layers::ForCompute(mlm_bias_));
  return {layers::MaskPaddedLogits(logits, config_.vocab_size), (*sentence_head_)(pooled)};
}

Tensor Bert::Loss(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                  const Tensor& mlm_labels, const Tensor& sentence_labels) const {
  const BertOutputs out = Forward(ids, token_type_ids, attention_mask);
  const Tensor mlm = layers::ParallelCrossEntropyLoss(out.mlm_logits, mlm_labels);
  const Tensor sentence = fn::cross_entropy(
      out.sentence_logits, layers::ToHidden(sentence_labels, out.sentence_logits.placement()));
  return fn::add(mlm, sentence);
}

Tensor Bert::ClassificationLogits(const Tensor& ids, const Tensor& token_type_ids,
                                  const Tensor& attention_mask) const {
  TESSEL_CHECK(classifier_ != nullptr)
      << "BERT: this model has the pre-training heads; a classifier needs BertConfig.num_labels >= 2";
  return (*classifier_)(classifier_dropout_(Encode(ids, token_type_ids, attention_mask).second));
}

Tensor Bert::ClassificationLoss(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                                const Tensor& labels) const {
  const Tensor logits = ClassificationLogits(ids, token_type_ids, attention_mask);
  return fn::cross_entropy(logits, layers::ToHidden(labels, logits.placement()));
}

BertLosses Bert::WeightedLosses(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                                const Tensor& mlm_labels, const Tensor& mlm_weights,
                                const Tensor& sentence_labels) const {
  TESSEL_CHECK(mlm_weights.shape() == mlm_labels.shape() && mlm_weights.dtype() == DType::kFloat32)
      << "BERT: mlm_weights " << mlm_weights.dtype() << " " << mlm_weights.shape()
      << "; expected f32 of the labels' shape " << mlm_labels.shape();
  const BertOutputs out = Forward(ids, token_type_ids, attention_mask);
  const Shape& s = out.mlm_logits.shape();
  const Placement& last = out.mlm_logits.placement();
  const Tensor rows = fn::cross_entropy_rows(fn::reshape(out.mlm_logits, {s[0] * s[1], s[2]}),
                                             fn::reshape(layers::ToHidden(mlm_labels, last), {s[0] * s[1]}));
  const Tensor weights = fn::reshape(layers::ToHidden(mlm_weights, last), {s[0] * s[1]});
  const Tensor sentence = fn::cross_entropy(
      out.sentence_logits, layers::ToHidden(sentence_labels, out.sentence_logits.placement()));
  return {fn::sum(fn::mul(rows, weights), {}), sentence};
}

}  // namespace tessel::models
