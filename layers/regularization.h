// Dropout, DropPath (stochastic depth) and the ViT patch embedding.
// Random masks come from Philox keyed by logical position (element for
// Dropout, sample for DropPath) and a per-layer counter that advances
// identically on every rank: the same masks under every layout. Dropout's
// counter is a tensor its ops read and advance, so a captured step (graph
// mode) draws new masks at every call, the ones eager code would draw.
#pragma once

#include "layers/linear.h"
#include "layers/module.h"

namespace tessel::layers {

class Dropout : public nn::Module {
 public:
  explicit Dropout(double p, uint64_t seed = 555) : p_(p), seed_(seed) {
    RegisterRngCounter("offset", offset_);
  }
  // Identity unless it drops().
  Tensor operator()(const Tensor& x);
  // Training with p > 0.
  bool drops() const { return is_training() && p_ > 0; }

 private:
  double p_;
  uint64_t seed_;
  nn::RngCounter offset_;  // elements drawn so far
};

class DropPath : public nn::Module {
 public:
  explicit DropPath(double p, uint64_t seed = 556) : p_(p), seed_(seed) {
    RegisterRngCounter("calls", calls_);
  }
  // Drops whole samples (dim 0) with probability p, scaling the kept ones.
  Tensor operator()(const Tensor& x);

 private:
  double p_;
  uint64_t seed_;
  nn::RngCounter calls_;  // calls so far (the masks are made on the host)
};

class PatchEmbedding : public nn::Module {
 public:
  // conv2d(in_channels -> hidden, kernel = stride = patch) as patchify then a
  // replicated Linear; weight [in_channels * patch^2, hidden].
  PatchEmbedding(int64_t in_channels, int64_t hidden, int64_t patch, int64_t layer_idx = 0,
                 uint64_t seed = 600, double init_std = 0.02);
  // images [batch, channels, height, width] -> [batch, patches, hidden].
  Tensor operator()(const Tensor& images) const;
  Linear proj;

 private:
  int64_t patch_;
};

}  // namespace tessel::layers
