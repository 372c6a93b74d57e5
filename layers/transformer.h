// Transformer building blocks (Megatron/LiBai tensor parallelism):
//   MultiheadAttention: fused QKV, column-parallel, laid out head-major
//     ([head][q|k|v][head_dim]) so a column split hands each rank whole
//     heads; causal or padding masks; row-parallel output projection.
//   MLP: column-parallel up-projection, GELU (exact or tanh form),
//     row-parallel down-projection.
//   TransformerLayer: pre-LN (or post-LN) attention and MLP with residuals;
//     its layer_idx moves the input to the layer's pipeline stage.
//   LMLogits: logits against a (tied) vocab-parallel embedding table.
//   ParallelCrossEntropyLoss: mean cross-entropy on vocab-split logits
//     without gathering them; labels equal to ignore_index do not count.
#pragma once

#include <memory>

#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/regularization.h"

namespace tessel::layers {

struct AttentionOptions {
  int64_t layer_idx = 0;
  bool causal = true;
  uint64_t seed = 77;
  double init_std = 0.02;  // of the normal its weights start from
  double dropout = 0;      // on the attention probabilities (training only)
  // On GPUs in bf16 or f16 (mixed precision), attention without the [seq,
  // seq] score matrix (fn::attention: flash-style tensor-core tiles) where
  // nothing needs the probabilities: no padding mask, no dropout on them,
  // one tensor-parallel axis. f32 and the CPU keep the matrix products
  // (their GEMMs are faster than the kernel's f32 path). On by default: on
  // an H100 it is faster than cuBLAS over the score matrix and needs no
  // [seq, seq] memory (docs/benchmarks.md).
  bool fused = true;
};

class MultiheadAttention : public nn::Module {
 public:
  // Throws naming the sizes if hidden % heads or heads % tp is not 0.
  MultiheadAttention(int64_t hidden, int64_t heads, AttentionOptions options = {});
  // x [batch, seq, hidden]; mask (optional) bool, broadcast to
  // [batch, heads, seq, seq], false = masked. A residual (optional, like the
  // output) is added to the output projection's result, in its op where it
  // can be.
  Tensor operator()(const Tensor& x, const Tensor& mask = Tensor(), const Tensor& residual = Tensor()) const;

  Linear qkv, out;

 private:
  // fn::attention in place of the score matrix (AttentionOptions::fused).
  bool UsesFusedAttention(const Tensor& q, const Tensor& mask) const;

  int64_t hidden_, heads_;
  AttentionOptions options_;
  mutable Dropout probs_dropout_;  // its mask counter advances per call
};

// GELU's exact (erf) form, BERT's and ViT's, or its tanh approximation,
// GPT-2's ("gelu_new" in Hugging Face).
enum class Activation { kGelu, kGeluTanh };

class MLP : public nn::Module {
 public:
  MLP(int64_t hidden, int64_t ffn_hidden, int64_t layer_idx = 0, uint64_t seed = 88, double init_std = 0.02,
      Activation activation = Activation::kGelu);
  // fc2(activation(fc1(x))), plus `residual` (optional) in fc2's op where it can be.
  Tensor operator()(const Tensor& x, const Tensor& residual = Tensor()) const;
  Linear fc1, fc2;

 private:
  Activation activation_;
};

struct TransformerLayerOptions {
  int64_t layer_idx = 0;
  bool pre_ln = true;
  bool causal = true;
  uint64_t seed = 1000;
  // Activation checkpointing (graph mode): the layer's forward after the
  // move to its stage is one RecomputeScope, recomputed in backward, so only
  // its input stays alive between forward and backward.
  bool activation_checkpoint = false;
  double layernorm_epsilon = 1e-5;
  double init_std = 0.02;  // of the normal its weights start from
  Activation activation = Activation::kGelu;
  // Dropout on the attention probabilities, and on the attention and MLP
  // outputs before each residual add (training only; eager mode only).
  double attention_dropout = 0;
  double hidden_dropout = 0;
  bool fused_attention = true;  // AttentionOptions::fused
};

class TransformerLayer : public nn::Module {
 public:
  TransformerLayer(int64_t hidden, int64_t heads, int64_t ffn_hidden, TransformerLayerOptions options = {});
  Tensor operator()(const Tensor& x, const Tensor& mask = Tensor()) const;

  LayerNorm ln1, ln2;
  MultiheadAttention attention;
  MLP mlp;

 private:
  TransformerLayerOptions options_;
  mutable Dropout attention_output_dropout_, mlp_output_dropout_;
};

// h [batch, seq, hidden] x table [vocab, hidden]^T -> [batch, seq, vocab],
// split on the vocabulary over tp.
// Computed on h's placement (the last stage), the table moved there if it
// lives elsewhere.
Tensor LMLogits(const Tensor& h, const Tensor& embedding_table);

// Fills what a padded vocabulary adds (columns vocab_size .. of logits [...,
// padded], split on the vocabulary or not) with kMaskedLogit, so softmax
// and loss never see it. Finite, as a tp slice may be all padding.
constexpr double kMaskedLogit = -1e30;
Tensor MaskPaddedLogits(const Tensor& logits, int64_t vocab_size);

// Mean over counted positions of the cross-entropy of logits [batch, seq,
// vocab] (split on vocab or not) against labels [batch, seq].
Tensor ParallelCrossEntropyLoss(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);

}  // namespace tessel::layers
