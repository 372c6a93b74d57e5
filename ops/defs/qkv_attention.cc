// qkv_attention: attention straight from the fused projection x [b, s,
// heads, 3 d] (each head's q, k and v side by side, as split_qkv reads it)
// to the output [b, s, heads, d] that the output projection reads, and the
// log-sum-exp [b, heads, s] (f32) its gradient reads; qkv_attention_grad
// gives dx in x's layout. The same values as split_qkv, attention and a
// permute (and, backwards, attention_grad and merge_qkv), without those
// copies: on a GPU the tensor-core kernels read q, k and v where they lie
// in x and write the output and dx in place.
#include "ops/cpu/attention.h"
#include "ops/cpu/qkv_heads.h"
#include "ops/cpu/tensor_ops.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/attention.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

// The whole sequence is on every shard (no signature splits it).
cpu::AttentionOptions Options(const Attrs& a) {
  return {static_cast<float>(a.Get<double>("scale")), a.Get<bool>("causal"), 0};
}

Shape OutShape(const Shape& x) {
  const Shape parts = cpu::SplitQkvPartShape(x);  // [b, heads, s, d]; checks x
  return Shape({parts[0], parts[2], parts[1], parts[3]});
}
Shape LseShape(const Shape& x) {
  const Shape parts = cpu::SplitQkvPartShape(x);
  return Shape({parts[0], parts[1], parts[2]});
}

}  // namespace

void RegisterQkvAttentionOps() {
  OpDef def;
  def.name = "qkv_attention";
  def.inputs = {"x"};
  def.num_outputs = 2;
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("qkv_attention", in[0], "x");
    return std::vector<TensorSpec>{{OutShape(in[0].shape), in[0].dtype},
                                   {LseShape(in[0].shape), DType::kFloat32}};
  };
  // The batch or the heads split (x's heads are its dim 2, lse's dim 1).
  def.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0)}, {S(0), S(0)}}, {{S(2)}, {S(2), S(1)}}};
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor> qkv = cpu::SplitQkv(ctx.inputs[0]);
    const std::vector<Tensor> r = cpu::Attention(qkv[0], qkv[1], qkv[2], Options(ctx.attrs));
    return std::vector<Tensor>{cpu::Permute(r[0], {0, 2, 1, 3}), r[1]};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return cuda::QkvAttention(ctx.inputs[0], Options(ctx.attrs));
  };
#endif
  def.grad = [](const GradContext& c) {
    if (!c.grad_outputs[0].defined()) return std::vector<Tensor>(1);  // only lse was used: no gradient
    return ApplyOp("qkv_attention_grad", {c.inputs[0], c.outputs[0], c.outputs[1], c.grad_outputs[0]},
                   c.attrs);
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "qkv_attention_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"x", "out", "lse", "dout"};
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("qkv_attention_grad", in[0], "x");
    const Shape out = OutShape(in[0].shape), lse = LseShape(in[0].shape);
    TESSEL_CHECK(in[1].shape == out && in[3].shape == out && in[1].dtype == in[0].dtype &&
                 in[3].dtype == in[0].dtype && in[2].shape == lse && in[2].dtype == DType::kFloat32)
        << "qkv_attention_grad: out " << in[1].dtype << " " << in[1].shape << ", lse " << in[2].dtype << " "
        << in[2].shape << ", dout " << in[3].dtype << " " << in[3].shape << " for x " << in[0].dtype << " "
        << in[0].shape << "; expected out and dout " << out << " in " << in[0].dtype << " and an f32 lse "
        << lse;
    return std::vector<TensorSpec>{in[0]};
  };
  grad.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0), S(0), S(0), S(0)}, {S(0)}}, {{S(2), S(2), S(1), S(2)}, {S(2)}}};
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const std::vector<Tensor> qkv = cpu::SplitQkv(in[0]);
    const std::vector<Tensor> g =
        cpu::AttentionGrad(qkv[0], qkv[1], qkv[2], cpu::Permute(in[1], {0, 2, 1, 3}), in[2],
                           cpu::Permute(in[3], {0, 2, 1, 3}), Options(ctx.attrs));
    return std::vector<Tensor>{cpu::MergeQkv(g[0], g[1], g[2])};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::QkvAttentionGrad(in[0], in[1], in[2], in[3], Options(ctx.attrs))};
  };
#endif
  // Each query's row term (f32); the CPU kernel's q, k, v, their gradients
  // and the permuted out and dout are more, and counted as such: three
  // copies of x and two of out (f32 on the CPU).
  grad.workspace_bytes = [](const std::vector<TensorSpec>& in) {
    return (3 * in[0].shape.numel() + 2 * in[1].shape.numel() + in[2].shape.numel()) * 4;
  };
  RegisterOp(std::move(grad));
}

}  // namespace tessel
