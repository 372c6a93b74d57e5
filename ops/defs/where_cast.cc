// where (select with broadcasting), equal, and cast between dtypes.
#include "ops/cpu/broadcast.h"
#include "ops/cpu/tensor_ops.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"

#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/where_cast.h"
#endif

namespace tessel {
namespace {

Shape Broadcast3(const std::vector<TensorSpec>& in) {
  return cpu::BroadcastShapes(cpu::BroadcastShapes(in[0].shape, in[1].shape), in[2].shape);
}

}  // namespace

void RegisterWhereCastOps() {
  OpDef where;
  where.name = "where";
  where.inputs = {"cond", "a", "b"};
  where.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    TESSEL_CHECK(in[0].dtype == DType::kBool) << "where: condition must be bool, got " << in[0].dtype;
    defs::CheckFloat("where", in[1], "a");
    defs::CheckFloat("where", in[2], "b");
    TESSEL_CHECK(in[1].dtype == in[2].dtype)
        << "where: a is " << in[1].dtype << " but b is " << in[2].dtype << "; cast one (fn::cast)";
    return std::vector<TensorSpec>{{Broadcast3(in), in[1].dtype}};
  };
  where.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::BroadcastSplits(in, Broadcast3(in));
  };
  where.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cpu::Where(in[0], in[1], in[2])};
  };
#ifdef TESSEL_HAS_CUDA
  where.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::Where(in[0], in[1], in[2])};
  };
#endif
  where.saved =
      OpDef::SavedForGrad{{0}, {}};  // the gradient reads the condition; the branches only for their shapes
  where.grad = [](const GradContext& c) {
    const Tensor& g = c.grad_outputs[0];
    Tensor zero = fn::mul_scalar(g, 0.0);
    return std::vector<Tensor>{Tensor(), fn::sum_to(fn::where(c.inputs[0], g, zero), c.inputs[1].shape()),
                               fn::sum_to(fn::where(c.inputs[0], zero, g), c.inputs[2].shape())};
  };
  RegisterOp(std::move(where));

  OpDef equal;
  equal.name = "equal";
  equal.not_differentiable = true;  // a bool result
  equal.inputs = {"a", "b"};
  equal.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    TESSEL_CHECK(in[0].dtype == in[1].dtype)
        << "equal: a is " << in[0].dtype << " " << in[0].shape << " but b is " << in[1].dtype << " "
        << in[1].shape << "; cast one (fn::cast)";
    return std::vector<TensorSpec>{{cpu::BroadcastShapes(in[0].shape, in[1].shape), DType::kBool}};
  };
  equal.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::BroadcastSplits(in, cpu::BroadcastShapes(in[0].shape, in[1].shape));
  };
  equal.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    Shape shape = cpu::BroadcastShapes(in[0].shape(), in[1].shape());
    Tensor out = Tensor::Empty(shape, DType::kBool);
    cpu::BroadcastIndex ia(in[0].shape(), shape), ib(in[1].shape(), shape);
    const float* a = in[0].data<float>();
    const float* b = in[1].data<float>();
    for (int64_t i = 0; i < shape.numel(); ++i) out.data<bool>()[i] = a[ia(i)] == b[ib(i)];
    return std::vector<Tensor>{out};
  };
#ifdef TESSEL_HAS_CUDA
  equal.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::Equal(in[0], in[1])};
  };
#endif
  RegisterOp(std::move(equal));

  OpDef cast;
  cast.name = "cast";
  cast.inputs = {"x"};
  cast.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    return std::vector<TensorSpec>{{in[0].shape, ParseDType(a.Get<std::string>("dtype"))}};
  };
  cast.sbp = defs::SplitAnyDimOrPartial;
  cast.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::Cast(in[0], ParseDType(a.Get<std::string>("dtype")))};
  };
#ifdef TESSEL_HAS_CUDA
  cast.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::Cast(in[0], ParseDType(a.Get<std::string>("dtype")))};
  };
#endif
  cast.saved = OpDef::SavedForGrad{};  // the gradient reads the dtype only
  cast.grad = [](const GradContext& c) {
    return std::vector<Tensor>{fn::cast(c.grad_outputs[0], c.inputs[0].dtype())};
  };
  RegisterOp(std::move(cast));
}

}  // namespace tessel
