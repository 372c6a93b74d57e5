// split_qkv: x [b, s, heads, 3 d] (a fused q/k/v projection, each head's q,
// k and v features side by side) -> q, k, v [b, heads, s, d], attention's
// head-major layout, in one copy; merge_qkv: its inverse. Each is the
// other's gradient. Attention took a permute and three slices here before,
// and their gradients three zero-padded slices, two adds and a permute.
#include "ops/cpu/qkv_heads.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/qkv_heads.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

namespace {

// x's dims [b, s, heads, 3 d] against the parts' [b, heads, s, d]: batch
// stays, sequence and heads swap places, the features are never split (a
// shard would cut across q, k and v).
const int kXDim[] = {0, 1, 2}, kPartDim[] = {0, 2, 1};

std::vector<SbpSignature> Signatures(bool split) {
  std::vector<SbpSignature> out;
  for (int i = 0; i < 3; ++i) {
    std::vector<Sbp> x = {S(kXDim[i])}, parts(3, S(kPartDim[i]));
    out.push_back(split ? SbpSignature{x, parts} : SbpSignature{parts, x});
  }
  std::vector<Sbp> x = {P()}, parts(3, P());
  out.push_back(split ? SbpSignature{x, parts} : SbpSignature{parts, x});
  return out;
}

}  // namespace

void RegisterQkvHeadsOps() {
  OpDef split;
  split.name = "split_qkv";
  split.inputs = {"x"};
  split.num_outputs = 3;
  split.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const TensorSpec part{cpu::SplitQkvPartShape(in[0].shape), in[0].dtype};
    return std::vector<TensorSpec>{part, part, part};
  };
  split.sbp = [](const std::vector<TensorSpec>&, const Attrs&) { return Signatures(/*split=*/true); };
  split.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) { return cpu::SplitQkv(ctx.inputs[0]); };
#ifdef TESSEL_HAS_CUDA
  split.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) { return cuda::SplitQkv(ctx.inputs[0]); };
#endif
  split.saved = OpDef::SavedForGrad{};  // the gradient reads no values
  split.grad = [](const GradContext& c) {
    // A part no loss reached gets zeros (of a reached part's shape: all three agree).
    Tensor any;
    for (const Tensor& g : c.grad_outputs)
      if (g.defined()) any = g;
    if (!any.defined()) return std::vector<Tensor>(1);
    std::vector<Tensor> g = c.grad_outputs;
    for (Tensor& t : g)
      if (!t.defined()) t = fn::mul_scalar(any, 0.0);
    return std::vector<Tensor>{fn::merge_qkv(g[0], g[1], g[2])};
  };
  RegisterOp(std::move(split));

  OpDef merge;
  merge.name = "merge_qkv";
  merge.inputs = {"q", "k", "v"};
  merge.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return std::vector<TensorSpec>{
        {cpu::MergeQkvShape({in[0].shape, in[1].shape, in[2].shape}, {in[0].dtype, in[1].dtype, in[2].dtype}),
         in[0].dtype}};
  };
  merge.sbp = [](const std::vector<TensorSpec>&, const Attrs&) { return Signatures(/*split=*/false); };
  merge.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cpu::MergeQkv(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2])};
  };
#ifdef TESSEL_HAS_CUDA
  merge.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::MergeQkv(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2])};
  };
#endif
  merge.saved = OpDef::SavedForGrad{};
  merge.grad = [](const GradContext& c) { return fn::split_qkv(c.grad_outputs[0]); };
  RegisterOp(std::move(merge));
}

}  // namespace tessel
