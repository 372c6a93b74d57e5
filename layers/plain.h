// Layers for a model written for one device, as a PyTorch user writes one
// before handing it to nnScaler: local parameters, plain functional ops,
// not a placement or a layout anywhere. parallel::parallelize lays such a
// model out over many ranks by a policy; the layers here know nothing of it.
// Weights are drawn from Philox by logical index (per-layer seeds), so two
// instances built with the same seeds hold the same values.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "layers/module.h"

namespace tessel::layers::plain {

// y = x W + b, W [in, out].
class Linear : public nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, uint64_t seed, double init_std = 0.02, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  Tensor weight, bias;

 private:
  int64_t in_, out_;
};

class LayerNorm : public nn::Module {
 public:
  explicit LayerNorm(int64_t hidden, double eps = 1e-5);
  Tensor operator()(const Tensor& x) const;
  Tensor weight, bias;

 private:
  double eps_;
};

// A lookup table [num, hidden].
class Embedding : public nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t hidden, uint64_t seed, double init_std = 0.02);
  Tensor operator()(const Tensor& ids) const;
  Tensor weight;
};

// Multi-head self-attention with separate query, key, value and output
// projections; x [batch, seq, hidden].
class SelfAttention : public nn::Module {
 public:
  SelfAttention(int64_t hidden, int64_t heads, bool causal, uint64_t seed, double init_std = 0.02);
  Tensor operator()(const Tensor& x) const;

 private:
  int64_t hidden_, heads_;
  bool causal_;
  Linear query_, key_, value_, out_;
};

// fc2(gelu(fc1(x))).
class Mlp : public nn::Module {
 public:
  Mlp(int64_t hidden, int64_t ffn_hidden, uint64_t seed, double init_std = 0.02);
  Tensor operator()(const Tensor& x) const;

 private:
  Linear fc1_, fc2_;
};

// A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(.)).
class Block : public nn::Module {
 public:
  Block(int64_t hidden, int64_t heads, int64_t ffn_hidden, bool causal, uint64_t seed, double eps = 1e-5,
        double init_std = 0.02);
  Tensor operator()(const Tensor& x) const;

 private:
  LayerNorm ln1_, ln2_;
  SelfAttention attention_;
  Mlp mlp_;
};

}  // namespace tessel::layers::plain
