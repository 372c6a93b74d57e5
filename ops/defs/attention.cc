// attention: softmax(scale * q k^T, causal) v without the score matrix, and
// attention_grad. q [..., sq, d], k and v [..., sk, d] with the same leading
// dims (batch, heads); outputs the result [..., sq, d] and each query's
// log-sum-exp [..., sq] (f32), which the gradient reads instead of the
// probabilities.
#include "ops/cpu/attention.h"

#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/attention.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

namespace {

void CheckAttentionSpecs(const char* op, const TensorSpec& q, const TensorSpec& k, const TensorSpec& v) {
  defs::CheckFloat(op, q, "q");
  TESSEL_CHECK(k.dtype == q.dtype && v.dtype == q.dtype)
      << op << ": q is " << q.dtype << ", k " << k.dtype << ", v " << v.dtype << "; expected one dtype";
  TESSEL_CHECK(q.shape.ndim() >= 3 && k.shape.ndim() == q.shape.ndim() && k.shape == v.shape &&
               k.shape[-1] == q.shape[-1])
      << op << ": q " << q.shape << ", k " << k.shape << ", v " << v.shape
      << "; expected [..., sq, d], [..., sk, d] and [..., sk, d] (rank >= 3)";
  for (int64_t d = 0; d + 2 < q.shape.ndim(); ++d) {
    TESSEL_CHECK(q.shape.dims()[d] == k.shape.dims()[d])
        << op << ": q " << q.shape << " and k " << k.shape << " differ in leading dim " << d;
  }
}

Shape LseShape(const Shape& q) { return Shape(std::vector<int64_t>(q.dims().begin(), q.dims().end() - 1)); }

// The causal limit of this shard's query rows: key j is visible to local
// row i when j <= i + shift (aligned at the last key, as scale_mask_softmax).
cpu::AttentionOptions Options(const KernelContext& ctx) {
  const int64_t query_dim = ctx.inputs[0].ndim() - 2;
  const int64_t sk = ctx.inputs[1].shape()[-2];
  return {static_cast<float>(ctx.attrs.Get<double>("scale")), ctx.attrs.Get<bool>("causal"),
          ctx.input_box(0)[query_dim].begin + sk - ctx.logical_inputs[0].shape[query_dim]};
}

}  // namespace

void RegisterAttentionOps() {
  OpDef def;
  def.name = "attention";
  def.inputs = {"q", "k", "v"};
  def.num_outputs = 2;
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    CheckAttentionSpecs("attention", in[0], in[1], in[2]);
    return std::vector<TensorSpec>{in[0], {LseShape(in[0].shape), DType::kFloat32}};
  };
  // Batch and head dims split alike; or the queries split, with every key.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const int n = static_cast<int>(in[0].shape.ndim());
    std::vector<SbpSignature> out;
    for (int d = 0; d + 2 < n; ++d) out.push_back({{S(d), S(d), S(d)}, {S(d), S(d)}});
    out.push_back({{S(n - 2), B(), B()}, {S(n - 2), S(n - 2)}});
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    return cpu::Attention(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], Options(ctx));
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return cuda::Attention(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], Options(ctx));
  };
#endif
  def.grad = [](const GradContext& c) {
    if (!c.grad_outputs[0].defined()) return std::vector<Tensor>(3);  // only lse was used: no gradient
    return ApplyOp("attention_grad",
                   {c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1], c.grad_outputs[0]},
                   c.attrs);
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "attention_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"q", "k", "v", "out", "lse", "dout"};
  grad.num_outputs = 3;
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    CheckAttentionSpecs("attention_grad", in[0], in[1], in[2]);
    TESSEL_CHECK(in[3].shape == in[0].shape && in[5].shape == in[0].shape && in[3].dtype == in[0].dtype &&
                 in[5].dtype == in[0].dtype && in[4].shape == LseShape(in[0].shape) &&
                 in[4].dtype == DType::kFloat32)
        << "attention_grad: out " << in[3].dtype << " " << in[3].shape << ", lse " << in[4].dtype << " "
        << in[4].shape << ", dout " << in[5].dtype << " " << in[5].shape << " for q " << in[0].dtype << " "
        << in[0].shape << "; expected out and dout like q and an f32 lse of " << LseShape(in[0].shape);
    return std::vector<TensorSpec>{in[0], in[1], in[2]};
  };
  // As the forward; with the queries split, each shard's key gradients are
  // partial sums.
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const int n = static_cast<int>(in[0].shape.ndim());
    std::vector<SbpSignature> out;
    for (int d = 0; d + 2 < n; ++d) out.push_back({std::vector<Sbp>(6, S(d)), {S(d), S(d), S(d)}});
    out.push_back({{S(n - 2), B(), B(), S(n - 2), S(n - 2), S(n - 2)}, {S(n - 2), P(), P()}});
    return out;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return cpu::AttentionGrad(in[0], in[1], in[2], in[3], in[4], in[5], Options(ctx));
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return cuda::AttentionGrad(in[0], in[1], in[2], in[3], in[4], in[5], Options(ctx));
  };
#endif
  // The f32 sum of the query gradients (CUDA tiles) and each row's term.
  grad.workspace_bytes = [](const std::vector<TensorSpec>& in) {
    return static_cast<int64_t>(in[0].shape.numel() + LseShape(in[0].shape).numel()) * 4;
  };
  RegisterOp(std::move(grad));
}

}  // namespace tessel
