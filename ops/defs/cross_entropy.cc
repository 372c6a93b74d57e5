// cross_entropy (per-row sparse softmax cross-entropy), its gradient, and
// masked_mean (the mean over rows whose label is not ignored).
#include "ops/cpu/cross_entropy.h"

#include "ops/cpu/elementwise.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/cross_entropy.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

int64_t Counted(const Tensor& labels, int64_t ignore_index) {
  int64_t n = 0;
  for (int64_t y : labels.ToVector<int64_t>()) n += y != ignore_index;
  return n;
}

}  // namespace

void RegisterCrossEntropyOps() {
  OpDef def;
  def.name = "cross_entropy";
  def.inputs = {"logits", "labels"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("cross_entropy", in[0], "logits");
    TESSEL_CHECK(in[0].shape.ndim() == 2 && in[1].dtype == DType::kInt64 &&
                 in[1].shape == Shape{in[0].shape[0]})
        << "cross_entropy needs logits [N, C] (got " << in[0].shape << ") and i64 labels [N] (got "
        << in[1].dtype << " " << in[1].shape << ")";
    return std::vector<TensorSpec>{{Shape{in[0].shape[0]}, DType::kFloat32}};  // f32 whatever the logits
  };
  def.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0), S(0)}, {S(0)}}};
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::SparseCrossEntropy(in[0], in[1], a.Get<int64_t>("ignore_index"))};
  };
#ifdef TESSEL_HAS_CUDA
  // The labels stay on the device, so the CPU's range check (which names
  // the row) is not made: an out-of-range label gives that row a NaN loss.
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::SparseCrossEntropy(in[0], in[1], a.Get<int64_t>("ignore_index"))};
  };
#endif
  def.saved =
      OpDef::SavedForGrad{{0, 1}, {}};  // the gradient reads the logits and labels, not the per-row loss
  def.grad = [](const GradContext& c) {
    Tensor d = ApplyOp("cross_entropy_grad", {c.inputs[0], c.inputs[1], c.grad_outputs[0]}, c.attrs).at(0);
    return std::vector<Tensor>{d, Tensor()};
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "cross_entropy_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"logits", "labels", "dloss"};
  // dlogits in the logits' dtype; dloss is f32 like the loss.
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    TESSEL_CHECK(in[2].dtype == DType::kFloat32)
        << "cross_entropy_grad: dloss must be f32 (the loss is f32 whatever the logits), got " << in[2].dtype;
    return std::vector<TensorSpec>{in[0]};
  };
  grad.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0), S(0), S(0)}, {S(0)}}};
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::SparseCrossEntropyGrad(in[0], in[1], in[2], a.Get<int64_t>("ignore_index"))};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cuda::SparseCrossEntropyGrad(in[0], in[1], in[2], a.Get<int64_t>("ignore_index"))};
  };
#endif
  RegisterOp(std::move(grad));

  // Replicated only for now: the count of rows is global.
  OpDef mean;
  mean.name = "masked_mean";
  mean.inputs = {"rows", "labels"};
  mean.infer = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<TensorSpec>{{Shape{}, DType::kFloat32}};
  };
  mean.sbp = [](const std::vector<TensorSpec>&, const Attrs&) { return std::vector<SbpSignature>{}; };
  mean.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    int64_t n = Counted(in[1], a.Get<int64_t>("ignore_index"));
    double s = 0;
    for (float v : in[0].ToVector<float>()) s += v;
    return std::vector<Tensor>{full(Shape{}, n > 0 ? s / static_cast<double>(n) : 0.0)};
  };
#ifdef TESSEL_HAS_CUDA
  mean.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::MaskedMean(in[0], in[1], ctx.attrs.Get<int64_t>("ignore_index"))};
  };
#endif
  mean.saved =
      OpDef::SavedForGrad{{1}, {}};  // the gradient reads the labels (which rows count), not the rows
  mean.grad = [](const GradContext& c) {
    return std::vector<Tensor>{ApplyOp("masked_mean_grad", {c.grad_outputs[0], c.inputs[1]}, c.attrs).at(0),
                               Tensor()};
  };
  RegisterOp(std::move(mean));

  OpDef mean_grad;
  mean_grad.name = "masked_mean_grad";
  mean_grad.grad_unsupported = defs::kGradientOp;
  mean_grad.inputs = {"dy", "labels"};
  mean_grad.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return std::vector<TensorSpec>{{in[1].shape, DType::kFloat32}};
  };
  mean_grad.sbp = [](const std::vector<TensorSpec>&, const Attrs&) { return std::vector<SbpSignature>{}; };
  mean_grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const int64_t ignore = a.Get<int64_t>("ignore_index");
    const int64_t n = Counted(in[1], ignore);
    const float g = in[0].data<float>()[0];
    Tensor out = Tensor::Empty(in[1].shape(), DType::kFloat32);
    const int64_t* y = in[1].data<int64_t>();
    for (int64_t i = 0; i < out.numel(); ++i)
      out.data<float>()[i] = y[i] == ignore ? 0.0f : g / static_cast<float>(n);
    return std::vector<Tensor>{out};
  };
#ifdef TESSEL_HAS_CUDA
  mean_grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::MaskedMeanGrad(in[0], in[1], ctx.attrs.Get<int64_t>("ignore_index"))};
  };
#endif
  RegisterOp(std::move(mean_grad));
}

}  // namespace tessel
