// linear: y = x W + b over x's last dimension (x [..., k], W [k, n], b [n]);
// linear_gelu_tanh: y = gelu_tanh(x W + b), with the pre-activation x W + b
// as a second output its gradient reads; linear_residual: y = x W + b + r
// (r like y: a skip connection); linear_weight_grad: dW = x^T dy and db = dy
// summed over the rows, the parameter gradients of all three.
//
// One op instead of matmul + add (+ gelu_tanh, + add) so that a GPU computes
// the bias, the activation or the residual in the GEMM's epilogue
// (cuBLASLt), and the bias gradient in the weight gradient's GEMM, instead
// of passes of their own over the activations. The CPU kernels compose the
// CPU matmul, add and activation, so the values are those of the unfused
// ops.
#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/gemm.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

// What follows the product in the op: the bias; the bias and gelu_tanh; the
// bias and a residual (the transformer's skip connection) added in.
enum class Epilogue { kBias, kGeluTanh, kResidual };

std::vector<TensorSpec> InferLinear(const std::string& op, const std::vector<TensorSpec>& in, Epilogue e) {
  const Shape &x = in[0].shape, &w = in[1].shape, &b = in[2].shape;
  defs::CheckFloat(op, in[0], "x");
  for (size_t i = 1; i < in.size(); ++i)
    TESSEL_CHECK(in[i].dtype == in[0].dtype) << op << ": x is " << in[0].dtype << " but "
                                             << (i == 1   ? "weight"
                                                 : i == 2 ? "bias"
                                                          : "residual")
                                             << " is " << in[i].dtype << "; cast it (fn::cast)";
  const TensorSpec y{cpu::LinearShape(op, x, w, b), in[0].dtype};
  if (e == Epilogue::kResidual) {
    TESSEL_CHECK(in[3].shape == y.shape)
        << op << ": the residual is " << in[3].shape << "; expected the output's " << y.shape << " (x " << x
        << ", weight " << w << ")";
  }
  if (e == Epilogue::kGeluTanh) return {y, y};
  return {y};
}

// Splits of x's rows stay splits of y's (W and b whole); a column split of W
// splits b and y's features alike. Without the activation the op is linear
// in x and b together, so a partial x (or a row split of W, summing partial
// products) takes a partial bias: the sum over the parts adds it once. A
// residual is laid out as the output.
std::vector<SbpSignature> LinearSignatures(const std::vector<TensorSpec>& in, Epilogue e) {
  const int last = static_cast<int>(in[0].shape.ndim()) - 1;
  const size_t outputs = e == Epilogue::kGeluTanh ? 2 : 1;
  std::vector<SbpSignature> out;
  auto add = [&](std::vector<Sbp> ins, const Sbp& y) {
    if (e == Epilogue::kResidual) ins.push_back(y);
    out.push_back({ins, std::vector<Sbp>(outputs, y)});
  };
  for (int d = 0; d < last; ++d) add({S(d), B(), B()}, S(d));
  add({B(), S(1), S(0)}, S(last));
  if (e != Epilogue::kGeluTanh) {
    add({S(last), S(0), P()}, P());
    add({P(), B(), P()}, P());
  }
  return out;
}

std::vector<Tensor> CpuLinear(const KernelContext& ctx, Epilogue e) {
  const std::vector<Tensor>& in = ctx.inputs;
  Tensor pre = cpu::Binary(cpu::BinaryOp::kAdd, cpu::Matmul(in[0], in[1]), in[2]);
  if (e == Epilogue::kResidual) return {cpu::Binary(cpu::BinaryOp::kAdd, pre, in[3])};
  if (e == Epilogue::kGeluTanh) return {cpu::Unary(cpu::UnaryOp::kGeluTanh, pre), pre};
  return {pre};
}

std::vector<Tensor> LinearGrad(const GradContext& c, Epilogue e) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  Tensor dy = c.grad_outputs[0];
  std::vector<Tensor> grads(c.inputs.size());
  if (e == Epilogue::kResidual && c.needs_input_grad[3]) grads[3] = dy;
  if (e == Epilogue::kGeluTanh)
    dy = ApplyOp("activation_grad", {c.outputs[1], dy}, {{"activation", std::string("gelu_tanh")}})[0];
  if (c.needs_input_grad[0]) grads[0] = fn::matmul(dy, w, false, true);
  if (c.needs_input_grad[1] || c.needs_input_grad[2]) {
    const std::vector<Tensor> g = fn::linear_weight_grad(x, dy);
    if (c.needs_input_grad[1]) grads[1] = g[0];
    if (c.needs_input_grad[2]) grads[2] = g[1];
  }
  return grads;
}

void RegisterLinear(const std::string& name, Epilogue e) {
  OpDef def;
  def.name = name;
  def.inputs = {"x", "weight", "bias"};
  if (e == Epilogue::kResidual) def.inputs.push_back("residual");
  def.num_outputs = e == Epilogue::kGeluTanh ? 2 : 1;
  def.infer = [name, e](const std::vector<TensorSpec>& in, const Attrs&) { return InferLinear(name, in, e); };
  def.sbp = [e](const std::vector<TensorSpec>& in, const Attrs&) { return LinearSignatures(in, e); };
  def.kernels[DeviceType::kCPU] = [e](const KernelContext& ctx) { return CpuLinear(ctx, e); };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [e](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return cuda::Linear(in[0], in[1], in[2], e == Epilogue::kGeluTanh,
                        e == Epilogue::kResidual ? in[3] : Tensor());
  };
#endif
  // The gradient reads x and W, and the pre-activation (not y).
  def.saved =
      OpDef::SavedForGrad{{0, 1}, e == Epilogue::kGeluTanh ? std::vector<int>{1} : std::vector<int>{}};
  def.grad = [e](const GradContext& c) { return LinearGrad(c, e); };
  RegisterOp(std::move(def));
}

}  // namespace

void RegisterLinearOps() {
  RegisterLinear("linear", Epilogue::kBias);
  RegisterLinear("linear_gelu_tanh", Epilogue::kGeluTanh);
  RegisterLinear("linear_residual", Epilogue::kResidual);

  OpDef grad;
  grad.name = "linear_weight_grad";
  grad.inputs = {"x", "dy"};
  grad.num_outputs = 2;
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const Shape &x = in[0].shape, &dy = in[1].shape;
    defs::CheckFloat("linear_weight_grad", in[0], "x");
    TESSEL_CHECK(in[1].dtype == in[0].dtype) << "linear_weight_grad: x is " << in[0].dtype << " but dy is "
                                             << in[1].dtype << "; cast one (fn::cast)";
    bool fits = x.ndim() >= 1 && x.ndim() == dy.ndim();
    for (int64_t d = 0; fits && d + 1 < x.ndim(); ++d) fits = x[d] == dy[d];
    TESSEL_CHECK(fits) << "linear_weight_grad: x [..., k] and dy [..., n] must agree on every dimension but "
                          "the last; got x "
                       << x << " and dy " << dy;
    return std::vector<TensorSpec>{{Shape({x[-1], dy[-1]}), in[0].dtype}, {Shape({dy[-1]}), in[0].dtype}};
  };
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    // Each rank's rows give partial sums of both; a feature split of dy
    // splits both gradients' features, one of x splits dW's rows.
    const int last = static_cast<int>(in[0].shape.ndim()) - 1;
    std::vector<SbpSignature> out;
    for (int d = 0; d < last; ++d) out.push_back({{S(d), S(d)}, {P(), P()}});
    out.push_back({{B(), S(last)}, {S(1), S(0)}});
    out.push_back({{S(last), B()}, {S(0), B()}});
    out.push_back({{P(), B()}, {P(), B()}});
    out.push_back({{B(), P()}, {P(), P()}});
    return out;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const Tensor &x = ctx.inputs[0], &dy = ctx.inputs[1];
    const int64_t k = x.shape()[-1], n = dy.shape()[-1];
    int64_t rows = 1;  // x's leading dims (k may be 0)
    for (int64_t d = 0; d + 1 < x.ndim(); ++d) rows *= x.shape()[d];
    const Tensor x2 = x.Reshape({rows, k}), dy2 = dy.Reshape({rows, n});
    return std::vector<Tensor>{cpu::Matmul(x2, dy2, true, false), cpu::SumToShape(dy2, Shape({n}))};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return cuda::LinearWeightGrad(ctx.inputs[0], ctx.inputs[1]);
  };
#endif
  grad.saved = OpDef::SavedForGrad{{0, 1}, {}};
  grad.grad = [](const GradContext& c) {
    // dW = x^T dy, db = sum(dy): linear in each input.
    const Tensor &x = c.inputs[0], &dy = c.inputs[1];
    const Tensor &gw = c.grad_outputs[0], &gb = c.grad_outputs[1];
    Tensor dx, ddy;
    if (c.needs_input_grad[0] && gw.defined()) dx = fn::matmul(dy, gw, false, true);
    if (c.needs_input_grad[1]) {
      if (gw.defined()) ddy = fn::matmul(x, gw);
      if (gb.defined()) ddy = ddy.defined() ? fn::add(ddy, gb) : fn::add(fn::mul_scalar(dy, 0.0), gb);
    }
    return std::vector<Tensor>{dx, ddy};
  };
  RegisterOp(std::move(grad));
}

}  // namespace tessel
