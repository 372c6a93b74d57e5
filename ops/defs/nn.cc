// Network ops: dropout, embedding (vocab-parallel when the table is split on
// the vocabulary), pick (one class per row, for vocab-parallel
// cross-entropy), patchify (ViT patch embedding) and the optimizer updates.
#include "ops/cpu/nn_kernels.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/nn_kernels.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::vector<int64_t> BoxBegin(const Box& b) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < b.ndim(); ++d) out.push_back(b[d].begin);
  return out;
}

// The table row whose lookups get no gradient (-1: none).
int64_t PaddingIndex(const Attrs& a) { return a.Has("padding_idx") ? a.Get<int64_t>("padding_idx") : -1; }

void RegisterDropout() {
  OpDef def;
  def.name = "dropout";
  // The offset is a tensor (an i64 scalar, replicated), not an attribute,
  // so a captured step reads where the layer's random stream stands at
  // every call (layers/regularization.h) rather than the offset it was
  // traced with.
  def.inputs = {"x", "offset"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("dropout", in[0], "x");
    TESSEL_CHECK(in[1].shape.ndim() == 0 && in[1].dtype == DType::kInt64)
        << "dropout's offset must be an i64 scalar; got " << in[1].dtype << " " << in[1].shape;
    return std::vector<TensorSpec>{in[0]};
  };
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    std::vector<SbpSignature> sigs = defs::SplitAnyDimOrPartial(in, a);  // for a fixed mask, linear in x
    for (SbpSignature& s : sigs) s.inputs.push_back(B());
    return sigs;
  };
  def.layout_attrs = std::vector<std::string>{};  // p and seed do not change the layout
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    // The mask is keyed by logical position: where the shard sits.
    const std::vector<int64_t> begin = BoxBegin(ctx.input_box(0));
    const std::vector<int64_t>& logical = ctx.logical_inputs[0].shape.dims();
    return std::vector<Tensor>{cpu::Dropout(in[0], a.Get<double>("p"),
                                            static_cast<uint64_t>(a.Get<int64_t>("seed")),
                                            static_cast<uint64_t>(in[1].data<int64_t>()[0]), begin, logical)};
  };
#ifdef TESSEL_HAS_CUDA
  // The kernel reads the offset on the device.
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Attrs& a = ctx.attrs;
    const std::vector<int64_t> begin = BoxBegin(ctx.input_box(0));
    const std::vector<int64_t>& logical = ctx.logical_inputs[0].shape.dims();
    return std::vector<Tensor>{cuda::Dropout(ctx.inputs[0], a.Get<double>("p"),
                                             static_cast<uint64_t>(a.Get<int64_t>("seed")), ctx.inputs[1],
                                             begin, logical)};
  };
#endif
  // The same mask applied to the gradient, regenerated from seed and offset.
  def.saved = OpDef::SavedForGrad{.inputs = {1}, .outputs = {}};
  def.grad = [](const GradContext& c) {
    return std::vector<Tensor>{
        fn::dropout(c.grad_outputs[0], c.inputs[1], c.attrs.Get<double>("p"), c.attrs.Get<int64_t>("seed")),
        Tensor()};
  };
  RegisterOp(std::move(def));
}

void RegisterEmbedding() {
  OpDef def;
  def.name = "embedding";
  def.inputs = {"table", "ids"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("embedding", in[0], "table");
    TESSEL_CHECK(in[0].shape.ndim() == 2 && in[1].dtype == DType::kInt64)
        << "embedding needs a table [V, H] and i64 ids; got " << in[0].shape << " and " << in[1].dtype << " "
        << in[1].shape;
    std::vector<int64_t> dims = in[1].shape.dims();
    dims.push_back(in[0].shape[1]);
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  // ids split -> rows split; hidden split -> last dim split; vocab split
  // (B ids) -> partial sums, each rank contributing the rows it owns.
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const int ids_rank = static_cast<int>(in[1].shape.ndim());
    std::vector<SbpSignature> out = {{{S(1), B()}, {S(ids_rank)}}, {{S(0), B()}, {P()}}, {{P(), B()}, {P()}}};
    for (int d = 0; d < ids_rank; ++d) out.push_back({{B(), S(d)}, {S(d)}});
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    // A vocab-split table holds rows [begin, end) of the logical table.
    return std::vector<Tensor>{cpu::Embedding(in[0], in[1], ctx.input_box(0)[0].begin)};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::Embedding(ctx.inputs[0], ctx.inputs[1], ctx.input_box(0)[0].begin)};
  };
#endif
  def.layout_attrs = std::vector<std::string>{};  // padding_idx does not change the layout
  def.saved = OpDef::SavedForGrad{{1}, {}};  // the gradient reads the indices; the table only for its shape
  def.grad = [](const GradContext& c) {
    Tensor d = ApplyOp("embedding_grad", {c.inputs[1], c.grad_outputs[0]},
                       {{"shape", c.inputs[0].shape().dims()}, {"padding_idx", PaddingIndex(c.attrs)}})
                   .at(0);
    return std::vector<Tensor>{d, Tensor()};
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "embedding_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"ids", "dy"};
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    // In dy's dtype: the table's, whose gradient it is.
    return std::vector<TensorSpec>{{Shape(a.Get<std::vector<int64_t>>("shape")), in[1].dtype}};
  };
  grad.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    const int ids_rank = static_cast<int>(in[0].shape.ndim());
    std::vector<SbpSignature> out = {{{B(), B()}, {S(0)}}, {{B(), S(ids_rank)}, {S(1)}}, {{B(), P()}, {P()}}};
    for (int d = 0; d < ids_rank; ++d) out.push_back({{S(d), S(d)}, {P()}});
    return out;
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Range rows = ctx.output_box(0)[0];  // the table rows this shard's gradient covers
    return std::vector<Tensor>{
        cpu::EmbeddingGrad(in[0], in[1], rows.begin, rows.size(), PaddingIndex(ctx.attrs))};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Range rows = ctx.output_box(0)[0];
    return std::vector<Tensor>{
        cuda::EmbeddingGrad(ctx.inputs[0], ctx.inputs[1], rows.begin, rows.size(), PaddingIndex(ctx.attrs))};
  };
#endif
  RegisterOp(std::move(grad));
}

void RegisterPick() {
  OpDef def;
  def.name = "pick";
  def.inputs = {"x", "labels"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    defs::CheckFloat("pick", in[0], "x");
    TESSEL_CHECK(in[0].shape.ndim() == 2 && in[1].dtype == DType::kInt64 &&
                 in[1].shape == Shape{in[0].shape[0]})
        << "pick needs x [N, C] and i64 labels [N]; got " << in[0].shape << " and " << in[1].dtype << " "
        << in[1].shape;
    return std::vector<TensorSpec>{{Shape{in[0].shape[0]}, in[0].dtype}};
  };
  // Class-split x: each rank picks the labels in its columns -> partial sums.
  def.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0), S(0)}, {S(0)}}, {{S(1), B()}, {P()}}, {{P(), B()}, {P()}}};
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const int64_t begin = ctx.input_box(0)[1].begin;  // first class column of this shard
    return std::vector<Tensor>{cpu::Pick(in[0], in[1], begin, a.Get<int64_t>("ignore_index"))};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const int64_t begin = ctx.input_box(0)[1].begin;
    return std::vector<Tensor>{
        cuda::Pick(ctx.inputs[0], ctx.inputs[1], begin, ctx.attrs.Get<int64_t>("ignore_index"))};
  };
#endif
  def.saved = OpDef::SavedForGrad{{1}, {}};  // the gradient reads the labels; the logits only for their shape
  def.grad = [](const GradContext& c) {
    Attrs a = c.attrs;
    a.Set("columns", c.inputs[0].shape()[1]);
    return std::vector<Tensor>{ApplyOp("pick_grad", {c.inputs[1], c.grad_outputs[0]}, a).at(0), Tensor()};
  };
  RegisterOp(std::move(def));

  OpDef grad;
  grad.name = "pick_grad";
  grad.grad_unsupported = defs::kGradientOp;
  grad.inputs = {"labels", "dy"};
  grad.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    return std::vector<TensorSpec>{{Shape{in[0].shape[0], a.Get<int64_t>("columns")}, in[1].dtype}};
  };
  grad.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
    return std::vector<SbpSignature>{{{S(0), S(0)}, {S(0)}}, {{B(), B()}, {S(1)}}, {{B(), P()}, {P()}}};
  };
  grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const Range columns = ctx.output_box(0)[1];  // the class columns this shard's gradient covers
    return std::vector<Tensor>{
        cpu::PickGrad(in[0], in[1], columns.begin, columns.size(), a.Get<int64_t>("ignore_index"))};
  };
#ifdef TESSEL_HAS_CUDA
  grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Range columns = ctx.output_box(0)[1];
    return std::vector<Tensor>{cuda::PickGrad(ctx.inputs[0], ctx.inputs[1], columns.begin, columns.size(),
                                              ctx.attrs.Get<int64_t>("ignore_index"))};
  };
#endif
  RegisterOp(std::move(grad));
}

void RegisterPatchify() {
  for (bool inverse : {false, true}) {
    OpDef def;
    def.name = inverse ? "unpatchify" : "patchify";
    def.inputs = {inverse ? "patches" : "images"};
    def.infer = [inverse](const std::vector<TensorSpec>& in, const Attrs& a) {
      const int64_t p = a.Get<int64_t>("patch");
      if (inverse)
        return std::vector<TensorSpec>{{Shape(a.Get<std::vector<int64_t>>("image_shape")), in[0].dtype}};
      const Shape& s = in[0].shape;
      TESSEL_CHECK(s.ndim() == 4 && p > 0 && s[2] % p == 0 && s[3] % p == 0)
          << "patchify needs images [B, C, H, W] with H, W divisible by the patch size " << p << "; got "
          << s;
      return std::vector<TensorSpec>{{Shape{s[0], (s[2] / p) * (s[3] / p), s[1] * p * p}, in[0].dtype}};
    };
    def.sbp = [](const std::vector<TensorSpec>&, const Attrs&) {
      return std::vector<SbpSignature>{{{S(0)}, {S(0)}}, {{P()}, {P()}}};
    };
    def.kernels[DeviceType::kCPU] = [inverse](const KernelContext& ctx) {
      const std::vector<Tensor>& in = ctx.inputs;
      const Attrs& a = ctx.attrs;
      const int64_t p = a.Get<int64_t>("patch");
      if (inverse)
        return std::vector<Tensor>{cpu::Unpatchify(in[0], ctx.output_shape(0), p)};  // this shard's images
      return std::vector<Tensor>{cpu::Patchify(in[0], p)};
    };
#ifdef TESSEL_HAS_CUDA
    def.kernels[DeviceType::kCUDA] = [inverse](const KernelContext& ctx) {
      const int64_t p = ctx.attrs.Get<int64_t>("patch");
      if (inverse) return std::vector<Tensor>{cuda::Unpatchify(ctx.inputs[0], ctx.output_shape(0), p)};
      return std::vector<Tensor>{cuda::Patchify(ctx.inputs[0], p)};
    };
#endif
    // Each is the other's gradient (a permutation of the elements).
    def.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
    def.grad = [inverse](const GradContext& c) {
      const int64_t patch = c.attrs.Get<int64_t>("patch");
      if (inverse) return ApplyOp("patchify", {c.grad_outputs[0]}, {{"patch", patch}});
      return ApplyOp("unpatchify", {c.grad_outputs[0]},
                     {{"patch", patch}, {"image_shape", c.inputs[0].shape().dims()}});
    };
    RegisterOp(std::move(def));
  }
}

// Parameters, gradients and states laid out alike (any split, or B).
std::vector<SbpSignature> SameLayout(const std::vector<TensorSpec>& in, size_t outputs) {
  return defs::AllSplitAlike(in[0].shape.ndim(), in.size(), outputs, -1);
}

void RegisterOptimizerUpdates() {
  OpDef adamw;
  adamw.name = "adamw_update";
  // step and lr are tensors (as in PyTorch's capturable optimizers), so a
  // captured training step reads the learning rate and counts its steps at
  // every call rather than replaying the ones it was traced with.
  adamw.inputs = {"param", "grad", "exp_avg", "exp_avg_sq", "step", "lr"};
  adamw.num_outputs = 4;
  adamw.mutates = {0, 2, 3, 4};  // param, exp_avg, exp_avg_sq; step is counted up first
  adamw.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (size_t i = 0; i < 4; ++i) {
      TESSEL_CHECK(in[i].shape == in[0].shape && in[i].dtype == DType::kFloat32)
          << "adamw_update needs f32 param, grad and states of one shape; got " << in[0].shape << " and "
          << in[i].dtype << " " << in[i].shape;
    }
    TESSEL_CHECK(in[4].shape.ndim() == 0 && in[4].dtype == DType::kInt64)
        << "adamw_update's step must be an i64 scalar; got " << in[4].dtype << " " << in[4].shape;
    TESSEL_CHECK(in[5].shape.ndim() == 0 && in[5].dtype == DType::kFloat32)
        << "adamw_update's lr must be an f32 scalar; got " << in[5].dtype << " " << in[5].shape;
    return std::vector<TensorSpec>{in[0], in[0], in[0], in[4]};
  };
  adamw.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    // The tensors of the parameter's shape share a layout; the scalars are
    // replicated.
    std::vector<SbpSignature> sigs = defs::AllSplitAlike(in[0].shape.ndim(), 4, 3, -1);
    for (SbpSignature& s : sigs) {
      s.inputs.push_back(B());
      s.inputs.push_back(B());
      s.outputs.push_back(B());
    }
    return sigs;
  };
  adamw.layout_attrs = std::vector<std::string>{};  // betas, eps and decay do not change the layout
  adamw.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    int64_t& step = in[4].data<int64_t>()[0];
    ++step;
    cpu::AdamWUpdate(in[0], in[1], in[2], in[3],
                     {static_cast<double>(in[5].data<float>()[0]), a.Get<double>("beta1"),
                      a.Get<double>("beta2"), a.Get<double>("eps"), a.Get<double>("weight_decay"), step});
    return std::vector<Tensor>{in[0], in[2], in[3], in[4]};
  };
#ifdef TESSEL_HAS_CUDA
  // The step is counted and the learning rate read by the kernels, on the
  // device.
  adamw.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    cuda::AdamWUpdate(in[0], in[1], in[2], in[3], in[4], in[5], a.Get<double>("beta1"),
                      a.Get<double>("beta2"), a.Get<double>("eps"), a.Get<double>("weight_decay"));
    return std::vector<Tensor>{in[0], in[2], in[3], in[4]};
  };
#endif
  RegisterOp(std::move(adamw));

  // dst's values replaced by src's, in place (dst keeps its storage and
  // layout; src is brought to that layout first): how a parameter takes the
  // values of its ZeRO shard after the update (an all-gather into it).
  OpDef assign;
  assign.name = "assign";
  assign.inputs = {"dst", "src"};
  assign.mutates = {0};
  assign.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    TESSEL_CHECK(in[0].shape == in[1].shape && in[0].dtype == in[1].dtype)
        << "assign needs dst and src of one shape and dtype; got " << in[0].dtype << " " << in[0].shape
        << " and " << in[1].dtype << " " << in[1].shape;
    return std::vector<TensorSpec>{in[0]};
  };
  assign.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
    return defs::AllSplitAlike(in[0].shape.ndim(), 2, 1, -1);
  };
  assign.layout_attrs = std::vector<std::string>{};
  auto copy = [](const KernelContext& ctx) {
    Tensor dst = ctx.inputs[0];
    dst.CopyFrom(ctx.inputs[1]);  // device to device, on the shard's device
    return std::vector<Tensor>{ctx.inputs[0]};
  };
  assign.kernels[DeviceType::kCPU] = copy;
#ifdef TESSEL_HAS_CUDA
  assign.kernels[DeviceType::kCUDA] = copy;
#endif
  RegisterOp(std::move(assign));

  OpDef sgd;
  sgd.name = "sgd_update";
  sgd.inputs = {"param", "grad", "momentum_buffer"};
  sgd.num_outputs = 2;
  sgd.mutates = {0, 2};  // param, momentum_buffer
  sgd.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
    for (const TensorSpec& t : in) {
      TESSEL_CHECK(t.shape == in[0].shape && t.dtype == DType::kFloat32)
          << "sgd_update needs f32 param, grad and buffer of one shape; got " << in[0].shape << " and "
          << t.dtype << " " << t.shape;
    }
    return std::vector<TensorSpec>{in[0], in[0]};
  };
  sgd.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) { return SameLayout(in, 2); };
  sgd.layout_attrs = std::vector<std::string>{};  // lr changes with the schedule
  sgd.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    cpu::SgdUpdate(in[0], in[1], in[2], a.Get<double>("lr"), a.Get<double>("momentum"),
                   a.Get<double>("weight_decay"), a.Get<bool>("first"));
    return std::vector<Tensor>{in[0], in[2]};
  };
#ifdef TESSEL_HAS_CUDA
  sgd.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    cuda::SgdUpdate(in[0], in[1], in[2], a.Get<double>("lr"), a.Get<double>("momentum"),
                    a.Get<double>("weight_decay"), a.Get<bool>("first"));
    return std::vector<Tensor>{in[0], in[2]};
  };
#endif
  RegisterOp(std::move(sgd));
}

}  // namespace

void RegisterNnOps() {
  RegisterDropout();
  RegisterEmbedding();
  RegisterPick();
  RegisterPatchify();
  RegisterOptimizerUpdates();
}

}  // namespace tessel
