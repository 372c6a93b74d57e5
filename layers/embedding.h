// Embeddings. VocabEmbedding splits the table on the vocabulary over tp
// (each rank looks up the ids it owns; the partial sums are reduced to the
// hidden layout); Embedding (positions, token types) is replicated.
#pragma once

#include <string>

#include "layers/module.h"

namespace tessel::layers {

struct EmbeddingOptions {
  int64_t layer_idx = 0;
  uint64_t seed = 4321;
  double init_std = 0.02;
  // >= 0: the row of the padding token, initialised to zeros, whose lookups
  // pass no gradient to the table (torch.nn.Embedding's padding_idx, as
  // Hugging Face's BERT uses it). -1: none.
  int64_t padding_idx = -1;
};

class VocabEmbedding : public nn::Module {
 public:
  // Throws naming the sizes if vocab_size is not divisible by tp (pad the
  // vocabulary to a multiple of tp, as Megatron does).
  VocabEmbedding(int64_t vocab_size, int64_t hidden, EmbeddingOptions options = {});
  // ids [batch, seq] (i64, local or global) -> [batch, seq, hidden] in the
  // hidden layout ([S(0) over dp, B over tp]).
  Tensor operator()(const Tensor& ids) const;
  Tensor weight;  // [vocab, hidden], [B, S(0)]

 private:
  int64_t padding_idx_ = -1;
};

class Embedding : public nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t hidden, EmbeddingOptions options = {});
  Tensor operator()(const Tensor& ids) const;
  Tensor weight;  // [num, hidden], replicated

 private:
  int64_t padding_idx_ = -1;
};

// vocab_size rounded up to a multiple of multiple x tp (multiple <= 1: of
// tp), as Megatron pads: each tp rank then holds an equal slice of the table.
int64_t PaddedVocabSize(int64_t vocab_size, int64_t multiple, int64_t tp);
// PaddedVocabSize under the current tp, logged on rank 0 (naming `model`)
// when it pads.
int64_t PaddedVocabSizeLogged(const std::string& model, int64_t vocab_size, int64_t multiple);

}  // namespace tessel::layers
