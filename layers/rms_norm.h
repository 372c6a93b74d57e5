// RMSNorm over the last dimension (Llama's; T5's layer norm is the same
// function): y = x / sqrt(mean(x^2) + eps) * weight, the weight replicated
// and starting at 1.
#pragma once

#include "layers/module.h"

namespace tessel::layers {

class RMSNorm : public nn::Module {
 public:
  // layer_idx: the pipeline stage's placement (-1: the last layer's).
  RMSNorm(int64_t hidden, double eps = 1e-6, int64_t layer_idx = 0);
  // x [..., hidden], moved to this layer's stage in the activation layout.
  Tensor operator()(const Tensor& x) const;
  Tensor weight;  // [hidden]

 private:
  double eps_;
};

}  // namespace tessel::layers
