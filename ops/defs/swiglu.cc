// swiglu: silu(gate) * up, Llama's gated MLP activation, and its gradient.
#include "ops/cpu/swiglu.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/swiglu.h"
#endif

namespace tessel {

void RegisterSwigluOps() {
  OpDef def;
  def.name = "swiglu";
  def.inputs = {"gate", "up"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("swiglu", in[0], "gate");
    TESSEL_CHECK(in[1].dtype == in[0].dtype && in[1].shape == in[0].shape)
        << "swiglu: gate " << in[0].dtype << " " << in[0].shape << " and up " << in[1].dtype << " "
        << in[1].shape << " must have one dtype and shape";
    return std::vector<TensorSpec>{in[0]};
  };
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 2, 1, -1);
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cpu::Swiglu(ctx.inputs[0], ctx.inputs[1])};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::Swiglu(ctx.inputs[0], ctx.inputs[1])};
  };
#endif
  def.saved = OpDef::SavedForGrad{{0, 1}, {}};
  def.grad = [](const GradContext& c) {
    return ApplyOp("swiglu_grad", {c.grad_outputs[0], c.inputs[0], c.inputs[1]});
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "swiglu_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"dy", "gate", "up"};
  grad.num_outputs = 2;
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (int i : {0, 2})
      TESSEL_CHECK(in[i].dtype == in[1].dtype && in[i].shape == in[1].shape)
          << "swiglu_grad: gate " << in[1].dtype << " " << in[1].shape << " but " << (i == 0 ? "dy" : "up")
          << " " << in[i].dtype << " " << in[i].shape;
    return std::vector<TensorSpec>{in[1], in[1]};
  };
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[1].shape.ndim(), 3, 2, -1);
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    cpu::SwigluGrads g = cpu::SwigluGrad(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]);
    return std::vector<Tensor>{g.dgate, g.dup};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    cuda::SwigluGrads g = cuda::SwigluGrad(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]);
    return std::vector<Tensor>{g.dgate, g.dup};
  };
#endif
  RegisterOp(std::move(grad));
}

}  // namespace tessel
