#include "layers/layer_norm.h"

#include "graph/autograd.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel::layers {

LayerNorm::LayerNorm(int64_t hidden, double eps, int64_t layer_idx) : eps_(eps) {
  const Placement p = dist::GetLayerPlacement(layer_idx);
  weight = ones({hidden}, p, dist::GetParameterNdSbp(Shape({hidden}), B()));
  bias = zeros({hidden}, p, dist::GetParameterNdSbp(Shape({hidden}), B()));
  RegisterParameter("weight", weight);
  RegisterParameter("bias", bias);
}

Tensor LayerNorm::operator()(const Tensor& x) const {
  return fn::layer_norm(ToActivations(x, weight.placement()), ForCompute(weight), ForCompute(bias), eps_);
}

}  // namespace tessel::layers
