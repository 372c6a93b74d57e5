// rms_norm over the last dimension with a weight (Llama's RMSNorm), and its
// gradient.
#include "ops/cpu/rms_norm.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/rms_norm.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

void RegisterRmsNormOps() {
  OpDef def;
  def.name = "rms_norm";
  def.inputs = {"x", "weight"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("rms_norm", in[0], "x");
    TESSEL_CHECK(in[1].dtype == in[0].dtype)
        << "rms_norm: x is " << in[0].dtype << " but weight is " << in[1].dtype << "; cast one (fn::cast)";
    TESSEL_CHECK(in[0].shape.ndim() >= 1 && in[1].shape == Shape{in[0].shape[-1]})
        << "rms_norm: weight " << in[1].shape << " must be [" << (in[0].shape.ndim() ? in[0].shape[-1] : 0)
        << "] for x " << in[0].shape;
    return std::vector<TensorSpec>{in[0]};
  };
  // Rows split, the weight replicated.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> out;
    for (int d = 0; d + 1 < in[0].shape.ndim(); ++d) out.push_back({{S(d), B()}, {S(d)}});
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{
        cpu::RmsNorm(ctx.inputs[0], ctx.inputs[1], static_cast<float>(ctx.attrs.Get<double>("eps")))};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{
        cuda::RmsNorm(ctx.inputs[0], ctx.inputs[1], static_cast<float>(ctx.attrs.Get<double>("eps")))};
  };
#endif
  def.saved = OpDef::SavedForGrad{{0, 1}, {}};  // the gradient reads x and the weight, not y
  def.grad = [](const GradContext& c) {
    return ApplyOp("rms_norm_grad", {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "rms_norm_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"dy", "x", "weight"};
  grad.num_outputs = 2;
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (int i : {0, 2})
      TESSEL_CHECK(in[i].dtype == in[1].dtype)
          << "rms_norm_grad: x is " << in[1].dtype << " but " << (i == 0 ? "dy" : "weight") << " is "
          << in[i].dtype << "; cast one (fn::cast)";
    TESSEL_CHECK(in[0].shape == in[1].shape)
        << "rms_norm_grad: dy " << in[0].shape << " for x " << in[1].shape;
    return std::vector<TensorSpec>{in[1], in[2]};
  };
  // Row splits leave a partial sum for the weight gradient.
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> out;
    for (int d = 0; d + 1 < in[1].shape.ndim(); ++d) out.push_back({{S(d), S(d), B()}, {S(d), P()}});
    return out;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    cpu::RmsNormGrads g =
        cpu::RmsNormGrad(in[0], in[1], in[2], static_cast<float>(ctx.attrs.Get<double>("eps")));
    return std::vector<Tensor>{g.dx, g.dweight};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    cuda::RmsNormGrads g =
        cuda::RmsNormGrad(in[0], in[1], in[2], static_cast<float>(ctx.attrs.Get<double>("eps")));
    return std::vector<Tensor>{g.dx, g.dweight};
  };
#endif
  RegisterOp(std::move(grad));
}

}  // namespace tessel
