// LayerNorm over the last dimension, parameters replicated.
#pragma once

#include "layers/module.h"

namespace tessel::layers {

class LayerNorm : public nn::Module {
 public:
  LayerNorm(int64_t hidden, double eps = 1e-5, int64_t layer_idx = 0);
  Tensor operator()(const Tensor& x) const;
  Tensor weight, bias;  // [hidden]

 private:
  double eps_;
};

}  // namespace tessel::layers
