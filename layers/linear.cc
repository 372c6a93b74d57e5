#include "layers/linear.h"

#include <optional>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::layers {

namespace {
// The input's dp-axis Sbp (kept), with `tp` on the tp axis.
NdSbp InputSbp(const Tensor& x, const Sbp& tp) {
  Sbp dp = dist::DataParallelSbp();
  if (x.is_global() && dist::GetConfig().data_parallel_size > 1) dp = x.nd_sbp()[0];
  return dist::GetNdSbp({dp, tp});
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, LinearOptions options)
    : in_(in_features), out_(out_features), options_(options) {
  const Placement placement = dist::GetLayerPlacement(options.layer_idx);
  if (dist::MultiAxisTensorParallel()) {
    // 2d, 2.5d, 3d: one layout per kind (dist::MultiAxisLinearLayouts);
    // the weight and bias kept split over the tensor mesh.
    const int64_t parts = dist::ColumnFeatureParts();
    TESSEL_CHECK(options.parallel != Parallel::kCol || out_features % parts == 0)
        << "column-parallel Linear: out_features=" << out_features << " is not divisible by " << parts
        << ", the parts tensor_parallel_mode '" << dist::GetConfig().tensor_parallel_mode
        << "' splits its output features into";
    // (The weight's layouts are the same for inputs of any rank; 3 is the
    // hidden states'.)
    const dist::LinearLayouts l = dist::MultiAxisLinearLayouts(options.parallel != Parallel::kRow,
                                                               options.parallel == Parallel::kData, 3);
    NoGradGuard no_grad;
    weight = fn::mul_scalar(
        randn({in_, out_}, placement, dist::GetParameterNdSbp(Shape({in_, out_}), l.weight), options.seed),
        options.init_std);
    if (options.bias) bias = zeros({out_}, placement, dist::GetParameterNdSbp(Shape({out_}), l.bias));
  } else {
    const int64_t tp = dist::GetConfig().tensor_parallel_size;
    TESSEL_CHECK(options.parallel != Parallel::kCol || out_features % tp == 0)
        << "column-parallel Linear: out_features=" << out_features
        << " is not divisible by tensor_parallel_size=" << tp;
    TESSEL_CHECK(options.parallel != Parallel::kRow || in_features % tp == 0)
        << "row-parallel Linear: in_features=" << in_features
        << " is not divisible by tensor_parallel_size=" << tp;
    const Sbp w_tp = options.parallel == Parallel::kCol   ? S(1)
                     : options.parallel == Parallel::kRow ? S(0)
                                                          : B();
    const Sbp b_tp = options.parallel == Parallel::kCol ? S(0) : B();
    NoGradGuard no_grad;
    weight = fn::mul_scalar(
        randn({in_, out_}, placement, dist::GetParameterNdSbp(Shape({in_, out_}), w_tp), options.seed),
        options.init_std);
    if (options.bias) bias = zeros({out_}, placement, dist::GetParameterNdSbp(Shape({out_}), b_tp));
  }
  RegisterParameter("weight", weight);
  if (options.bias) RegisterParameter("bias", bias);
}

Tensor Linear::operator()(const Tensor& x_in, LinearActivation activation, const Tensor& residual) const {
  const Placement placement = weight.placement();
  Tensor x = x_in.is_global() ? x_in : FromLocal(x_in, placement, dist::GetNdSbp({B(), B()}), x_in.shape());
  TESSEL_CHECK(x.shape().ndim() >= 1 && x.shape()[-1] == in_)
      << "Linear(" << in_ << " -> " << out_ << "): input of shape " << x.shape() << " has " << x.shape()[-1]
      << " features; expected " << in_;
  TESSEL_CHECK(activation == LinearActivation::kNone || !options_.skip_bias_add)
      << "Linear(" << in_ << " -> " << out_ << "): an activation needs the bias added in the layer, but "
      << "skip_bias_add is set";
  TESSEL_CHECK(activation == LinearActivation::kNone || !residual.defined())
      << "Linear(" << in_ << " -> " << out_ << "): an activation and a residual together";
  const bool has_bias = bias.defined() && !options_.skip_bias_add;
  bool bias_added = false, activated = false, residual_added = false;
  // x W, with the bias (and the activation, when `with_activation`, or the
  // residual) in the same op when `fuse`.
  std::vector<int64_t> y_dims = x.shape().dims();
  y_dims.back() = out_;
  const Shape y_shape(y_dims);
  auto product = [&](const Tensor& a, bool fuse, bool with_activation) {
    if (!fuse || !has_bias) return fn::matmul(a, ForCompute(weight));
    bias_added = true;
    if (with_activation && activation == LinearActivation::kGeluTanh) {
      activated = true;
      return fn::linear_gelu_tanh(a, ForCompute(weight), ForCompute(bias));
    }
    if (residual.defined() && residual.is_global() == a.is_global() && residual.shape() == y_shape &&
        residual.dtype() == a.dtype()) {
      residual_added = true;
      return fn::linear_residual(a, ForCompute(weight), ForCompute(bias), residual);
    }
    return fn::linear(a, ForCompute(weight), ForCompute(bias));
  };
  Tensor y;
  if (dist::MultiAxisTensorParallel()) {
    // SUMMA-style: x gathered along one mesh axis, W along another, the
    // product reduce-scattered along the third (3d) or already in place.
    const dist::LinearLayouts l = dist::MultiAxisLinearLayouts(
        options_.parallel != Parallel::kRow, options_.parallel == Parallel::kData, x.ndim());
    y = ReducedInto(fn::matmul(x.to_global(placement, l.input_compute),
                               GatheredForCompute(ForCompute(weight), l.weight_compute)),
                    l.output);
  } else {
    switch (options_.parallel) {
      case Parallel::kCol: {
        // Copied to every tp rank forwards; the input gradient (partial over
        // tp) comes back in the input's layout: all-reduced (Megatron's "f"),
        // or reduce-scattered on the sequence under sequence parallelism,
        // whose forward all-gathers it.
        const NdSbp in_sbp = InputSbp(x, B());
        const NdSbp grad_sbp = x.nd_sbp().has_partial() ? in_sbp : x.nd_sbp();
        // A gathered sequence is not kept for backward (1/tp of it is, the
        // input): in graph mode backward gathers it again, as Megatron does.
        std::optional<RecomputeScope> regather;
        if (dist::GetConfig().sequence_parallel && x.ndim() >= 3 && x.nd_sbp() != in_sbp) regather.emplace();
        // (The activation stays out of that region: its gradient reads the
        // pre-activation, which backward would then recompute with the GEMM.)
        y = product(x.to_global(placement, in_sbp, grad_sbp), true,
                    !regather.has_value());  // [S(0), S(last)]
      } break;
      case Parallel::kRow: {
        // With tp = 1 there is nothing to reduce, and the bias goes in the
        // product (as a partial value on the tp axis of size one).
        y = product(x.to_global(placement, InputSbp(x, S(static_cast<int>(x.ndim() - 1)))),
                    dist::GetConfig().tensor_parallel_size == 1, true);
        // The partial sums over tp reduced: all-reduced, or reduce-scattered on
        // the sequence under sequence parallelism, whose backward all-gathers
        // the gradient (Megatron's pattern: for the long sequences it is meant
        // for, the activations' gradient, not the weight, is what moves).
        const bool sequence = dist::GetConfig().sequence_parallel && y.ndim() >= 3;
        if (sequence)
          y = y.to_global(placement, InputSbp(y, S(1)), InputSbp(y, B()));
        else
          y = y.to_global(placement, InputSbp(y, B()));
      } break;
      case Parallel::kData:
        y = product(x.to_global(placement, InputSbp(x, B())), true, true);
        break;
    }
  }
  if (has_bias && !bias_added) y = fn::add(y, ForCompute(bias));
  if (activation == LinearActivation::kGeluTanh && !activated) y = fn::gelu_tanh(y);
  return residual.defined() && !residual_added ? fn::add(residual, y) : y;
}

}  // namespace tessel::layers
