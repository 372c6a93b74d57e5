// Linear layers: data-, column- and row-parallel (Megatron/LiBai style).
//
//   col: weight split on the output features over tp; the input is made B
//        on the tp axis (its gradient, a partial sum, is reduced in backward);
//        the output stays split on its last dimension.
//   row: weight split on the input features; the input is expected split on
//        its last dimension (a col layer's output); the output, a partial
//        sum over tp, is reduced to B.
//   data: weight replicated.
// y = x W + b with W [in, out]. Parameters are drawn from Philox by logical
// index, so every layout starts from the same logical weights.
#pragma once

#include <cstdint>

#include "layers/module.h"

namespace tessel::layers {

enum class Parallel { kData, kCol, kRow };

// What follows the bias inside the layer (GPT-2's MLP: gelu_tanh), so that
// one op computes both where it can (fn::linear_gelu_tanh).
enum class LinearActivation { kNone, kGeluTanh };

struct LinearOptions {
  Parallel parallel = Parallel::kData;
  bool bias = true;
  int64_t layer_idx = 0;       // its pipeline stage's placement
  bool skip_bias_add = false;  // return x W and leave the bias to the caller (fusions)
  uint64_t seed = 1234;
  double init_std = 0.02;
};

class Linear : public nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  // activation(x W + b), plus `residual` when given (a skip connection added
  // to the output; not with an activation). The bias (and the activation
  // or the residual) go in one op with the product (fn::linear and its
  // kin) unless a reduction over tp comes between them (a row-parallel
  // layer with tp > 1, the multi-axis modes).
  Tensor operator()(const Tensor& x, LinearActivation activation = LinearActivation::kNone,
                    const Tensor& residual = Tensor()) const;

  Tensor weight;  // [in, out]
  Tensor bias;    // [out] (undefined without bias)
  const LinearOptions& options() const { return options_; }

 private:
  int64_t in_, out_;
  LinearOptions options_;
};

}  // namespace tessel::layers
