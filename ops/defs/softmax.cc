// softmax over the last dimension, and softmax_grad.
#include "ops/cpu/softmax.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/softmax.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

void RegisterSoftmaxOps() {
  OpDef def;
  def.name = "softmax";
  def.inputs = {"x"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("softmax", in[0], "x");
    TESSEL_CHECK(in[0].shape.ndim() >= 1) << "softmax needs a tensor of rank >= 1";
    return std::vector<TensorSpec>{in[0]};
  };
  // Rows are independent: any split but of the softmax dimension.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 1, 1, in[0].shape.ndim() - 1);
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cpu::Softmax(in[0])};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::Softmax(ctx.inputs[0])};
  };
#endif
  def.saved = OpDef::SavedForGrad{{}, {0}};  // the gradient reads y, not x
  def.grad = [](const GradContext& c) { return ApplyOp("softmax_grad", {c.outputs[0], c.grad_outputs[0]}); };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "softmax_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"y", "dy"};
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    TESSEL_CHECK(in[1].dtype == in[0].dtype)
        << "softmax_grad: y is " << in[0].dtype << " but dy is " << in[1].dtype << "; cast one (fn::cast)";
    return std::vector<TensorSpec>{in[0]};
  };
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 2, 1, in[0].shape.ndim() - 1);
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    float scale = a.Has("scale") ? static_cast<float>(a.Get<double>("scale")) : 1.0f;
    return std::vector<Tensor>{cpu::SoftmaxGrad(in[0], in[1], scale)};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    float scale = a.Has("scale") ? static_cast<float>(a.Get<double>("scale")) : 1.0f;
    return std::vector<Tensor>{cuda::SoftmaxGrad(in[0], in[1], scale)};
  };
#endif
  RegisterOp(std::move(grad));

  // softmax(scale * x) with masked keys (mask false) and an optional causal
  // mask over the last two dims: attention's fused form.
  OpDef fused;
  fused.name = "scale_mask_softmax";
  fused.inputs = {"x", "mask"};
  fused.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    defs::CheckFloat("scale_mask_softmax", in[0], "x");
    TESSEL_CHECK(in[1].dtype == DType::kBool) << "scale_mask_softmax: mask must be bool, got " << in[1].dtype;
    TESSEL_CHECK(!a.Get<bool>("causal") || in[0].shape.ndim() >= 2)
        << "scale_mask_softmax: causal needs [..., q, k] scores, got " << in[0].shape;
    return std::vector<TensorSpec>{in[0]};
  };
  // Batch, head and query dims split (the mask alike where it has them);
  // a causal kernel places its rows by the shard's offset among the queries.
  fused.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const Shape &x = in[0].shape, &m = in[1].shape;
    const int64_t last = x.ndim() - 1;
    std::vector<SbpSignature> out;
    for (int64_t d = 0; d < last; ++d) {
      int64_t md = d - (x.ndim() - m.ndim());
      bool has = md >= 0 && m.dims()[md] == x.dims()[d];
      out.push_back(
          {{S(static_cast<int>(d)), has ? S(static_cast<int>(md)) : B()}, {S(static_cast<int>(d))}});
    }
    return out;
  };
  fused.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const int64_t query_dim = in[0].ndim() - 2;
    return std::vector<Tensor>{
        cpu::Softmax(in[0], {static_cast<float>(a.Get<double>("scale")), in[1], a.Get<bool>("causal"),
                             query_dim >= 0 ? ctx.input_box(0)[query_dim].begin : 0,
                             query_dim >= 0 ? ctx.logical_inputs[0].shape[query_dim] : 0})};
  };
#ifdef TESSEL_HAS_CUDA
  fused.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const int64_t query_dim = in[0].ndim() - 2;
    return std::vector<Tensor>{
        cuda::Softmax(in[0], {static_cast<float>(a.Get<double>("scale")), in[1], a.Get<bool>("causal"),
                              query_dim >= 0 ? ctx.input_box(0)[query_dim].begin : 0,
                              query_dim >= 0 ? ctx.logical_inputs[0].shape[query_dim] : 0})};
  };
#endif
  fused.saved = OpDef::SavedForGrad{{}, {0}};  // the gradient reads y, not the scores or the mask
  fused.grad = [](const GradContext& c) {
    Tensor dx =
        ApplyOp("softmax_grad", {c.outputs[0], c.grad_outputs[0]}, {{"scale", c.attrs.Get<double>("scale")}})
            .at(0);
    return std::vector<Tensor>{dx, Tensor()};
  };
  RegisterOp(std::move(fused));
}

}  // namespace tessel
