#include "layers/rms_norm.h"

#include "core/error.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

RMSNorm::RMSNorm(int64_t hidden, double eps, int64_t layer_idx) : eps_(eps) {
  // The row statistic needs every feature of a row: the multi-axis modes
  // split them (LayerNorm all-reduces its statistics there; nothing here does).
  TESSEL_CHECK(!dist::MultiAxisTensorParallel())
      << "RMSNorm: tensor_parallel_mode '" << dist::GetConfig().tensor_parallel_mode
      << "' splits the hidden features; RMSNorm supports the 1d mode";
  TESSEL_CHECK(eps >= 0) << "RMSNorm: eps=" << eps << "; expected >= 0";
  weight = ones({hidden}, dist::GetLayerPlacement(layer_idx),
                dist::GetParameterNdSbp(Shape({hidden}), dist::GetNdSbp({B(), B()})));
  RegisterParameter("weight", weight);
}

Tensor RMSNorm::operator()(const Tensor& x_in) const {
  const Tensor x = ToActivations(x_in, weight.placement());
  return fn::rms_norm(x, ForCompute(weight), eps_);
}

}  // namespace tessel::layers
