// BERT (Devlin et al.) for pre-training: token (vocab-parallel), position
// and token-type embeddings summed and normalised, post-LN transformer
// layers without a causal mask, a pooler (dense + tanh on the first token),
// a masked-LM head (dense, GELU, LayerNorm, logits tied to the token
// embedding plus a bias) and a two-way sentence head (next-sentence or
// sentence-order prediction). The same function as Hugging Face's
// BertForPreTraining (exact GELU and epsilon 1e-12 by default there).
//
// With num_labels > 0 it is a sequence classifier instead (fine-tuning):
// the same encoder and pooler, then dropout and a linear classifier of
// num_labels classes in place of the pre-training heads, the same function
// as BertForSequenceClassification (single-label: cross-entropy).
//
// The vocabulary is padded as GPT-2's (models/gpt.h) and the padded logits
// masked out. The pooler, heads and their LayerNorm are replicated over tp
// and live on the last stage; the embeddings on the first.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/regularization.h"
#include "layers/transformer.h"

namespace tessel::models {

struct BertConfig {
  int64_t vocab_size = 1000;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t layers = 2;
  int64_t max_seq = 64;    // position embeddings
  int64_t ffn_hidden = 0;  // 0: 4 x hidden
  int64_t type_vocab_size = 2;
  // The word embedding's padding row (Hugging Face's pad_token_id): zero at
  // initialisation, no gradient from lookups. -1: none.
  int64_t pad_token_id = 0;
  double layernorm_epsilon = 1e-12;
  double init_std = 0.02;
  uint64_t seed = 2024;
  layers::Activation activation = layers::Activation::kGelu;
  double embedding_dropout = 0, attention_dropout = 0, hidden_dropout = 0;
  // On GPUs, attention without the score matrix (layers::AttentionOptions::fused).
  bool fused_attention = true;
  int64_t make_vocab_size_divisible_by = 128;
  bool activation_checkpoint = false;
  int64_t num_labels = 0;  // > 0: a sequence classifier of that many classes (at least 2)
  double classifier_dropout = 0;
};

struct BertOutputs {
  Tensor mlm_logits;       // [batch, seq, padded vocab], split on the vocabulary over tp
  Tensor sentence_logits;  // [batch, 2]
};

struct BertLosses {
  Tensor mlm;       // scalar: the masked-LM term
  Tensor sentence;  // scalar: the sentence head's mean cross-entropy
};

class Bert : public nn::Module {
 public:
  explicit Bert(const BertConfig& config);
  // ids, token_type_ids [batch, seq] (i64; undefined types: all 0);
  // attention_mask [batch, seq] (bool, false for padding; undefined: none).
  // Pre-training models only (num_labels 0).
  BertOutputs Forward(const Tensor& ids, const Tensor& token_type_ids = Tensor(),
                      const Tensor& attention_mask = Tensor()) const;
  // The pre-training loss: the masked-LM cross-entropy over positions whose
  // mlm_labels are not -100, plus the sentence head's cross-entropy against
  // sentence_labels [batch] (0 / 1).
  Tensor Loss(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
              const Tensor& mlm_labels, const Tensor& sentence_labels) const;
  // The same terms for training, the masked-LM one weighted per position:
  // sum over positions of mlm_weights [batch, seq] (f32, 0 where not
  // predicted) x cross-entropy. The caller picks the normalisation:
  // tessel-train weighs each predicted position by micro-batches / (the
  // global batch's predicted positions), so that a step's loss is the mean
  // over the whole batch under any layout and accumulation, as on one device.
  BertLosses WeightedLosses(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                            const Tensor& mlm_labels, const Tensor& mlm_weights,
                            const Tensor& sentence_labels) const;
  int64_t padded_vocab_size() const { return padded_vocab_; }

  // Sequence classifiers only (num_labels > 0): logits [batch, num_labels]
  // (replicated over tp, on the last stage) and their mean cross-entropy
  // against labels [batch] (i64; -100 rows ignored).
  Tensor ClassificationLogits(const Tensor& ids, const Tensor& token_type_ids = Tensor(),
                              const Tensor& attention_mask = Tensor()) const;
  Tensor ClassificationLoss(const Tensor& ids, const Tensor& token_type_ids, const Tensor& attention_mask,
                            const Tensor& labels) const;

 private:
  // The encoder's last hidden states [batch, seq, hidden] and the pooler's
  // output [batch, hidden].
  std::pair<Tensor, Tensor> Encode(const Tensor& ids, const Tensor& token_type_ids,
                                   const Tensor& attention_mask) const;

  BertConfig config_;
  int64_t padded_vocab_;
  layers::VocabEmbedding word_embeddings_;
  layers::Embedding position_embeddings_, token_type_embeddings_;
  layers::LayerNorm embedding_ln_;
  mutable layers::Dropout embedding_dropout_;
  std::vector<std::unique_ptr<layers::TransformerLayer>> blocks_;
  layers::Linear pooler_;
  // Pre-training heads (num_labels 0) or the classifier (num_labels > 0).
  std::unique_ptr<layers::Linear> mlm_transform_, sentence_head_;
  std::unique_ptr<layers::LayerNorm> mlm_ln_;
  Tensor mlm_bias_;  // [padded vocab], split over tp like the logits
  mutable layers::Dropout classifier_dropout_;
  std::unique_ptr<layers::Linear> classifier_;
};

}  // namespace tessel::models
