#include "layers/layer_norm.h"

#include "graph/autograd.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

namespace {
// Layer norm of hidden states whose features are split over some mesh axes
// (the multi-axis tensor-parallel modes): each rank sums its features, and
// the two row statistics (mean, then variance) are all-reduced, [rows]
// elements each, instead of gathering the features.
Tensor LayerNormOfSplitFeatures(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const int64_t last = x.ndim() - 1;
  const double inverse_count = 1.0 / static_cast<double>(x.shape()[last]);
  auto row_mean = [&](const Tensor& t) {
    // Partial where the features are split; all-reduced, and so is its
    // gradient (else the row gradient stays partial, and so would the
    // hidden states' gradient it is broadcast into: whole [rows, hidden]
    // buffers reduced later instead of [rows] here).
    const Tensor sums = fn::sum(t, {last}, /*keepdim=*/true);
    const NdSbp reduced = sums.nd_sbp().WithoutPartial();
    return fn::mul_scalar(sums.to_global(sums.placement(), reduced, reduced), inverse_count);
  };
  const Tensor centred = fn::sub(x, row_mean(x));
  const Tensor variance = row_mean(fn::mul(centred, centred));
  const Tensor normed = fn::div(centred, fn::sqrt(fn::add_scalar(variance, eps)));
  return fn::add(fn::mul(normed, gamma), beta);
}
}  // namespace

LayerNorm::LayerNorm(int64_t hidden, double eps, int64_t layer_idx) : eps_(eps) {
  const Placement p = dist::GetLayerPlacement(layer_idx);
  // Laid out like the hidden states' features: replicated, or split with
  // them under the multi-axis tensor-parallel modes.
  const NdSbp layout = dist::MultiAxisTensorParallel()
                           ? dist::FeatureParameterSbp(dist::GetActivationSbp(2), 2)
                           : dist::GetNdSbp({B(), B()});
  weight = ones({hidden}, p, dist::GetParameterNdSbp(Shape({hidden}), layout));
  bias = zeros({hidden}, p, dist::GetParameterNdSbp(Shape({hidden}), layout));
  RegisterParameter("weight", weight);
  RegisterParameter("bias", bias);
}

Tensor LayerNorm::operator()(const Tensor& x_in) const {
  const Tensor x = ToActivations(x_in, weight.placement());
  if (dist::MultiAxisTensorParallel() && x.ndim() >= 2)
    return LayerNormOfSplitFeatures(x, ForCompute(weight), ForCompute(bias), eps_);
  return fn::layer_norm(x, ForCompute(weight), ForCompute(bias), eps_);
}

}  // namespace tessel::layers
