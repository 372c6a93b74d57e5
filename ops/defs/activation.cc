// relu, gelu (erf and tanh forms), tanh, neg, exp, log, sqrt, and activation_grad, the
// gradient kernel they share.
#include "ops/cpu/elementwise.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"

#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/elementwise.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

cpu::UnaryOp Kind(const std::string& name) {
  if (name == "relu") return cpu::UnaryOp::kRelu;
  if (name == "gelu") return cpu::UnaryOp::kGeluErf;
  if (name == "gelu_tanh") return cpu::UnaryOp::kGeluTanh;
  if (name == "tanh") return cpu::UnaryOp::kTanh;
  if (name == "neg") return cpu::UnaryOp::kNeg;
  if (name == "exp") return cpu::UnaryOp::kExp;
  if (name == "log") return cpu::UnaryOp::kLog;
  if (name == "sqrt") return cpu::UnaryOp::kSqrt;
  TESSEL_THROW(StatusCode::kInvalidArgument) << "unknown activation '" << name << "'";
}

void RegisterActivation(const std::string& name) {
  OpDef def;
  def.name = name;
  def.inputs = {"x"};
  def.infer = [name](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat(name, in[0], "x");
    return std::vector<TensorSpec>{in[0]};
  };
  def.sbp = name == "neg" ? defs::SplitAnyDimOrPartial : defs::SplitAnyDim;  // neg is linear
  def.kernels[DeviceType::kCPU] = [name](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cpu::Unary(Kind(name), in[0])};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [name](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::Unary(Kind(name), in[0])};
  };
#endif
  // activation_grad reads x (not y); neg's gradient reads nothing.
  def.saved = OpDef::SavedForGrad{name == "neg" ? std::vector<int>{} : std::vector<int>{0}, {}};
  def.grad = [name](const GradContext& c) {
    if (name == "neg") return std::vector<Tensor>{fn::neg(c.grad_outputs[0])};
    return ApplyOp("activation_grad", {c.inputs[0], c.grad_outputs[0]}, {{"activation", name}});
  };
  RegisterOp(std::move(def));
}

}  // namespace

void RegisterActivationOps() {
  for (const char* name : {"relu", "gelu", "gelu_tanh", "tanh", "neg", "exp", "log", "sqrt"})
    RegisterActivation(name);
  OpDef grad;
  grad.name = "activation_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"x", "dy"};
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    TESSEL_CHECK(in[0].dtype == in[1].dtype)
        << "activation_grad (" << a.Get<std::string>("activation") << "): x is " << in[0].dtype
        << " but dy is " << in[1].dtype << "; cast one (fn::cast)";
    return std::vector<TensorSpec>{in[0]};
  };
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> s = defs::AllSplitAlike(in[0].shape.ndim(), 2, 1, -1);
    s.push_back({{B(), P()}, {P()}});  // linear in dy
    return s;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::UnaryGrad(Kind(a.Get<std::string>("activation")), in[0], in[1])};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::UnaryGrad(Kind(a.Get<std::string>("activation")), in[0], in[1])};
  };
#endif
  RegisterOp(std::move(grad));
}

}  // namespace tessel
