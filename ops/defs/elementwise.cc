// add, sub, mul, div (NumPy broadcasting) and their scalar forms.
#include "ops/cpu/elementwise.h"

#include "ops/cpu/broadcast.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"

#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/elementwise.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::vector<TensorSpec> InferBinary(const std::string& op, const std::vector<TensorSpec>& in) {
  TESSEL_CHECK(in[0].dtype == in[1].dtype)
      << op << ": dtypes differ: a is " << in[0].dtype << " " << in[0].shape << " but b is " << in[1].dtype
      << " " << in[1].shape << "; cast one (fn::cast)";
  return {{cpu::BroadcastShapes(in[0].shape, in[1].shape), in[0].dtype}};
}

void RegisterBinary(const std::string& name, cpu::BinaryOp op, std::vector<SbpSignature> partial_rules,
                    OpDef::SavedForGrad saved, std::function<std::vector<Tensor>(const GradContext&)> grad) {
  OpDef def;
  def.name = name;
  def.inputs = {"a", "b"};
  def.infer = [name](const std::vector<TensorSpec>& in, const Attrs&) { return InferBinary(name, in); };
  def.sbp = [partial_rules](const std::vector<TensorSpec>& in, const Attrs&) {
    std::vector<SbpSignature> s = defs::BroadcastSplits(in, cpu::BroadcastShapes(in[0].shape, in[1].shape));
    s.insert(s.end(), partial_rules.begin(), partial_rules.end());
    return s;
  };
  def.kernels[DeviceType::kCPU] = [op](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cpu::Binary(op, in[0], in[1])};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [op](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::Binary(op, in[0], in[1])};
  };
#endif
  def.saved = std::move(saved);
  def.grad = std::move(grad);
  RegisterOp(std::move(def));
}

void RegisterScalar(const std::string& name, cpu::BinaryOp op, bool partial_ok, double grad_scale_sign) {
  OpDef def;
  def.name = name;
  def.inputs = {"a"};
  def.infer = defs::SameAsInput;
  def.sbp = partial_ok ? defs::SplitAnyDimOrPartial : defs::SplitAnyDim;
  def.layout_attrs = std::vector<std::string>{};  // the scalar (a clipping scale, say) changes per call
  def.kernels[DeviceType::kCPU] = [op](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::BinaryScalar(op, in[0], a.Get<double>("scalar"))};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [op](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::BinaryScalar(op, in[0], a.Get<double>("scalar"))};
  };
#endif
  def.saved = OpDef::SavedForGrad{};  // the gradient is the scalar times dy
  def.grad = [op, grad_scale_sign](const GradContext& c) {
    const Tensor& g = c.grad_outputs[0];
    if (op == cpu::BinaryOp::kMul)
      return std::vector<Tensor>{fn::mul_scalar(g, c.attrs.Get<double>("scalar"))};
    return std::vector<Tensor>{grad_scale_sign == 1.0 ? g : fn::mul_scalar(g, grad_scale_sign)};
  };
  RegisterOp(std::move(def));
}

}  // namespace

void RegisterElementwiseOps() {
  using cpu::BinaryOp;
  RegisterBinary("add", BinaryOp::kAdd, {{{P(), P()}, {P()}}}, {}, [](const GradContext& c) {
    const Tensor& g = c.grad_outputs[0];
    return std::vector<Tensor>{fn::sum_to(g, c.inputs[0].shape()), fn::sum_to(g, c.inputs[1].shape())};
  });
  RegisterBinary("sub", BinaryOp::kSub, {{{P(), P()}, {P()}}}, {}, [](const GradContext& c) {
    const Tensor& g = c.grad_outputs[0];
    return std::vector<Tensor>{fn::sum_to(g, c.inputs[0].shape()),
                               fn::sum_to(fn::neg(g), c.inputs[1].shape())};
  });
  RegisterBinary("mul", BinaryOp::kMul, {{{P(), B()}, {P()}}, {{B(), P()}, {P()}}}, {{0, 1}, {}},
                 [](const GradContext& c) {
                   const Tensor &a = c.inputs[0], &b = c.inputs[1], &g = c.grad_outputs[0];
                   Tensor da = c.needs_input_grad[0] ? fn::sum_to(fn::mul(g, b), a.shape()) : Tensor();
                   Tensor db = c.needs_input_grad[1] ? fn::sum_to(fn::mul(g, a), b.shape()) : Tensor();
                   return std::vector<Tensor>{da, db};
                 });
  RegisterBinary("div", BinaryOp::kDiv, {{{P(), B()}, {P()}}}, {{1}, {0}}, [](const GradContext& c) {
    const Tensor &a = c.inputs[0], &b = c.inputs[1], &g = c.grad_outputs[0];
    Tensor da = c.needs_input_grad[0] ? fn::sum_to(fn::div(g, b), a.shape()) : Tensor();
    Tensor db = c.needs_input_grad[1] ? fn::sum_to(fn::neg(fn::div(fn::mul(g, c.outputs[0]), b)),
                                                   b.shape())  // -g*a/b^2 = -g*y/b
                                      : Tensor();
    return std::vector<Tensor>{da, db};
  });
  // x + s is not linear (P would add s once per rank); x * s is.
  RegisterScalar("add_scalar", BinaryOp::kAdd, /*partial_ok=*/false, 1.0);
  RegisterScalar("mul_scalar", BinaryOp::kMul, /*partial_ok=*/true, 1.0);
}

}  // namespace tessel
