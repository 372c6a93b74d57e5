// layer_norm over the last dimension with weight and bias, and its gradient.
#include "ops/cpu/layer_norm.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/layer_norm.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

void RegisterLayerNormOps() {
  OpDef def;
  def.name = "layer_norm";
  def.inputs = {"x", "gamma", "beta"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (int i = 0; i < 3; ++i)
      defs::CheckFloat("layer_norm", in[i], i == 0 ? "x" : i == 1 ? "gamma" : "beta");
    for (int i = 1; i < 3; ++i)
      TESSEL_CHECK(in[i].dtype == in[0].dtype)
          << "layer_norm: x is " << in[0].dtype << " but " << (i == 1 ? "gamma" : "beta") << " is "
          << in[i].dtype << "; cast one (fn::cast)";
    const int64_t d = in[0].shape.ndim() ? in[0].shape[-1] : 0;
    TESSEL_CHECK(in[1].shape == Shape{d} && in[2].shape == Shape{d})
        << "layer_norm: gamma " << in[1].shape << " and beta " << in[2].shape << " must be [" << d
        << "] for x " << in[0].shape;
    return std::vector<TensorSpec>{in[0]};
  };
  // Rows split, parameters replicated.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> out;
    for (int d = 0; d + 1 < in[0].shape.ndim(); ++d) out.push_back({{S(d), B(), B()}, {S(d)}});
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::LayerNorm(in[0], in[1], in[2], static_cast<float>(a.Get<double>("eps"))).y};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cuda::LayerNorm(in[0], in[1], in[2], static_cast<float>(a.Get<double>("eps"))).y};
  };
#endif
  def.saved = OpDef::SavedForGrad{{0, 1}, {}};  // the gradient reads x and gamma; beta and y are not read
  def.grad = [](const GradContext& c) {
    return ApplyOp("layer_norm_grad", {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
  };
  RegisterOp(std::move(def));

  // Recomputes mean and rstd from x (cheap next to saving them per row).
  OpDef grad;
  grad.name = "layer_norm_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"dy", "x", "gamma"};
  grad.num_outputs = 3;
  // dx, dgamma and dbeta in x's dtype (which dy and gamma share).
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (int i : {0, 2})
      TESSEL_CHECK(in[i].dtype == in[1].dtype)
          << "layer_norm_grad: x is " << in[1].dtype << " but " << (i == 0 ? "dy" : "gamma") << " is "
          << in[i].dtype << "; cast one (fn::cast)";
    return std::vector<TensorSpec>{in[1], in[2], in[2]};
  };
  // Row splits leave partial sums for the parameter gradients.
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> out;
    for (int d = 0; d + 1 < in[1].shape.ndim(); ++d) out.push_back({{S(d), S(d), B()}, {S(d), P(), P()}});
    return out;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    cpu::LayerNormResult r = cpu::LayerNorm(in[1], in[2], Tensor(), static_cast<float>(a.Get<double>("eps")));
    cpu::LayerNormGrads g = cpu::LayerNormGrad(in[0], in[1], r.mean, r.rstd, in[2]);
    return std::vector<Tensor>{g.dx, g.dgamma, g.dbeta};
  };
#ifdef TESSEL_HAS_CUDA
  // The row pass recomputes mean and rstd itself: no forward (and no y).
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    cuda::LayerNormGrads g =
        cuda::LayerNormGrad(in[0], in[1], in[2], static_cast<float>(a.Get<double>("eps")));
    return std::vector<Tensor>{g.dx, g.dgamma, g.dbeta};
  };
#endif
  RegisterOp(std::move(grad));
}

}  // namespace tessel
