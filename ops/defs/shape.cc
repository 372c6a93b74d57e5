// reshape, transpose, permute, slice (and slice_grad), concat.
#include "ops/cpu/tensor_ops.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"
#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/tensor_ops.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {
// (input dim, output dim) at the start of each run of dims whose products
// match, skipping size-1 dims that only pad a run.
std::vector<std::pair<int64_t, int64_t>> ReshapeGroupStarts(const std::vector<int64_t>& in,
                                                            const std::vector<int64_t>& out) {
  std::vector<std::pair<int64_t, int64_t>> starts;
  size_t i = 0, o = 0;
  while (i < in.size() && o < out.size()) {
    starts.push_back({static_cast<int64_t>(i), static_cast<int64_t>(o)});
    int64_t pi = in[i++], po = out[o++];
    while (pi != po) {
      if (pi < po && i < in.size())
        pi *= in[i++];
      else if (po < pi && o < out.size())
        po *= out[o++];
      else
        break;
    }
  }
  return starts;
}
}  // namespace

void RegisterShapeOps() {
  OpDef reshape;
  reshape.name = "reshape";
  reshape.inputs = {"x"};
  reshape.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    Shape shape(a.Get<std::vector<int64_t>>("shape"));
    TESSEL_CHECK(shape.numel() == in[0].shape.numel())
        << "reshape of " << in[0].shape << " (" << in[0].shape.numel() << " elements) to " << shape << " ("
        << shape.numel() << " elements)";
    return std::vector<TensorSpec>{{shape, in[0].dtype}};
  };
  // Dimensions group into runs with equal products (a dim kept, split into
  // several, or several merged). A split on a group's first input dim maps
  // to the group's first output dim; check_layout keeps only layouts whose
  // shards line up (they do when the split sizes divide evenly).
  reshape.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    for (const auto& [d, o] : ReshapeGroupStarts(in[0].shape.dims(), a.Get<std::vector<int64_t>>("shape"))) {
      out.push_back({{S(static_cast<int>(d))}, {S(static_cast<int>(o))}});
    }
    return out;
  };
  // Valid when every shard's elements are one output shard's: per mesh
  // coordinate, the split dim's range times the rest of its group must match.
  reshape.check_layout = [](const Attrs& a, const std::vector<TensorSpec>& in,
                            const std::vector<NdSbp>& in_sbp, const std::vector<NdSbp>& out_sbp,
                            const Placement& placement) {
    const Shape out_shape(a.Get<std::vector<int64_t>>("shape"));
    const std::vector<int64_t> si = in[0].shape.ContiguousStrides(), so = out_shape.ContiguousStrides();
    for (int i = 0; i < placement.size(); ++i) {
      const std::vector<int64_t> coord = placement.Coord(i);
      const Box ib = SliceOf(in[0].shape, in_sbp[0], placement.hierarchy(), coord);
      const Box ob = SliceOf(out_shape, out_sbp[0], placement.hierarchy(), coord);
      if (ib.numel() != ob.numel()) return false;
      // Flat offset of each shard's first element must agree too.
      int64_t fi = 0, fo = 0;
      for (int64_t d = 0; d < ib.ndim(); ++d) fi += ib[d].begin * si[d];
      for (int64_t d = 0; d < ob.ndim(); ++d) fo += ob[d].begin * so[d];
      if (ib.numel() > 0 && fi != fo) return false;
    }
    return true;
  };
  reshape.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const Shape shape = ctx.output_shape(0);
    TESSEL_CHECK(shape.numel() == in[0].numel())
        << "reshape of " << ctx.logical_inputs[0].shape << " to "
        << Shape(a.Get<std::vector<int64_t>>("shape")) << ": this rank's shard " << in[0].shape()
        << " does not line up with its output shard " << shape
        << "; make the split dimension divisible by the mesh axis";
    // Kernels never write their inputs, so the result can share the data.
    return std::vector<Tensor>{in[0].Reshape(shape)};
  };
#ifdef TESSEL_HAS_CUDA
  // A view shares the storage wherever it lives.
  reshape.kernels[DeviceType::kCUDA] = reshape.kernels[DeviceType::kCPU];
#endif
  reshape.view = true;
  reshape.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  reshape.grad = [](const GradContext& c) {
    return std::vector<Tensor>{fn::reshape(c.grad_outputs[0], c.inputs[0].shape())};
  };
  RegisterOp(std::move(reshape));

  OpDef transpose;
  transpose.name = "transpose";
  transpose.inputs = {"x"};
  transpose.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    std::vector<int64_t> dims = in[0].shape.dims();
    std::swap(dims[in[0].shape.NormalizeAxis(a.Get<int64_t>("dim0"))],
              dims[in[0].shape.NormalizeAxis(a.Get<int64_t>("dim1"))]);
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  transpose.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    int64_t d0 = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim0"));
    int64_t d1 = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim1"));
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    for (int64_t d = 0; d < in[0].shape.ndim(); ++d) {
      int64_t to = d == d0 ? d1 : d == d1 ? d0 : d;
      out.push_back({{S(static_cast<int>(d))}, {S(static_cast<int>(to))}});
    }
    return out;
  };
  transpose.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    // A transpose is the permutation that swaps two axes.
    std::vector<int64_t> perm(in[0].ndim());
    for (int64_t d = 0; d < in[0].ndim(); ++d) perm[d] = d;
    std::swap(perm[in[0].shape().NormalizeAxis(a.Get<int64_t>("dim0"))],
              perm[in[0].shape().NormalizeAxis(a.Get<int64_t>("dim1"))]);
    return std::vector<Tensor>{cpu::Permute(in[0], perm)};
  };
#ifdef TESSEL_HAS_CUDA
  transpose.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Tensor& x = ctx.inputs[0];
    std::vector<int64_t> perm(x.ndim());
    for (int64_t d = 0; d < x.ndim(); ++d) perm[d] = d;
    std::swap(perm[x.shape().NormalizeAxis(ctx.attrs.Get<int64_t>("dim0"))],
              perm[x.shape().NormalizeAxis(ctx.attrs.Get<int64_t>("dim1"))]);
    return std::vector<Tensor>{cuda::Permute(x, perm)};
  };
#endif
  transpose.saved = OpDef::SavedForGrad{};  // the gradient reads nothing
  transpose.grad = [](const GradContext& c) {
    return std::vector<Tensor>{
        fn::transpose(c.grad_outputs[0], c.attrs.Get<int64_t>("dim0"), c.attrs.Get<int64_t>("dim1"))};
  };
  RegisterOp(std::move(transpose));

  OpDef permute;
  permute.name = "permute";
  permute.inputs = {"x"};
  permute.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& perm = a.Get<std::vector<int64_t>>("perm");
    TESSEL_CHECK(static_cast<int64_t>(perm.size()) == in[0].shape.ndim())
        << "permute of " << in[0].shape << " needs " << in[0].shape.ndim() << " axes, got " << perm.size();
    std::vector<int64_t> dims;
    for (int64_t p : perm) dims.push_back(in[0].shape[p]);
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  permute.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& perm = a.Get<std::vector<int64_t>>("perm");
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    for (size_t i = 0; i < perm.size(); ++i) {
      out.push_back({{S(static_cast<int>(in[0].shape.NormalizeAxis(perm[i])))}, {S(static_cast<int>(i))}});
    }
    return out;
  };
  permute.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::Permute(in[0], a.Get<std::vector<int64_t>>("perm"))};
  };
#ifdef TESSEL_HAS_CUDA
  permute.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::Permute(ctx.inputs[0], ctx.attrs.Get<std::vector<int64_t>>("perm"))};
  };
#endif
  permute.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  permute.grad = [](const GradContext& c) {
    const auto& perm = c.attrs.Get<std::vector<int64_t>>("perm");
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i)
      inverse[c.inputs[0].shape().NormalizeAxis(perm[i])] = static_cast<int64_t>(i);
    return std::vector<Tensor>{fn::permute(c.grad_outputs[0], inverse)};
  };
  RegisterOp(std::move(permute));

  // Splits survive on every dimension but the sliced one.
  auto splits_except = [](const Shape& shape, int64_t dim, size_t inputs) {
    std::vector<SbpSignature> out = {{std::vector<Sbp>(inputs, P()), {P()}}};
    for (int64_t d = 0; d < shape.ndim(); ++d)
      if (d != dim)
        out.push_back({std::vector<Sbp>(inputs, S(static_cast<int>(d))), {S(static_cast<int>(d))}});
    return out;
  };

  OpDef slice;
  slice.name = "slice";
  slice.inputs = {"x"};
  slice.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    int64_t dim = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim"));
    int64_t begin = a.Get<int64_t>("begin"), end = a.Get<int64_t>("end");
    TESSEL_CHECK(0 <= begin && begin <= end && end <= in[0].shape[dim])
        << "slice [" << begin << ":" << end << "] of dimension " << dim << " of " << in[0].shape;
    std::vector<int64_t> dims = in[0].shape.dims();
    dims[dim] = end - begin;
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  slice.sbp = [splits_except](const std::vector<TensorSpec>& in, const Attrs& a) {
    return splits_except(in[0].shape, in[0].shape.NormalizeAxis(a.Get<int64_t>("dim")), 1);
  };
  slice.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::Slice(in[0], a.Get<int64_t>("dim"), a.Get<int64_t>("begin"), a.Get<int64_t>("end"))};
  };
#ifdef TESSEL_HAS_CUDA
  slice.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cuda::Slice(ctx.inputs[0], a.Get<int64_t>("dim"), a.Get<int64_t>("begin"), a.Get<int64_t>("end"))};
  };
#endif
  slice.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  slice.grad = [](const GradContext& c) {
    Attrs a = c.attrs;
    a.Set("shape", c.inputs[0].shape().dims());
    return ApplyOp("slice_grad", {c.grad_outputs[0]}, a);
  };
  RegisterOp(std::move(slice));

  OpDef slice_grad;  // zeros of the input's shape with the gradient placed at the slice
  slice_grad.name = "slice_grad";
  slice_grad.grad_unsupported = defs::kGradientOp;
  slice_grad.inputs = {"dy"};
  slice_grad.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    return std::vector<TensorSpec>{{Shape(a.Get<std::vector<int64_t>>("shape")), in[0].dtype}};
  };
  slice_grad.sbp = [splits_except](const std::vector<TensorSpec>& in, const Attrs& a) {
    return splits_except(in[0].shape, in[0].shape.NormalizeAxis(a.Get<int64_t>("dim")), 1);
  };
  slice_grad.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    // The output shard is whole along `dim` (never split there) and cut
    // like the gradient elsewhere.
    return std::vector<Tensor>{
        cpu::PadSlice(in[0], ctx.output_shape(0), a.Get<int64_t>("dim"), a.Get<int64_t>("begin"))};
  };
#ifdef TESSEL_HAS_CUDA
  slice_grad.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cuda::PadSlice(ctx.inputs[0], ctx.output_shape(0), a.Get<int64_t>("dim"), a.Get<int64_t>("begin"))};
  };
#endif
  RegisterOp(std::move(slice_grad));

  OpDef concat;
  concat.name = "concat";
  concat.inputs = {"xs"};
  concat.variadic = true;
  concat.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    int64_t dim = in[0].shape.NormalizeAxis(a.Get<int64_t>("dim"));
    std::vector<int64_t> dims = in[0].shape.dims();
    dims[dim] = 0;
    for (const TensorSpec& t : in) {
      TESSEL_CHECK(t.dtype == in[0].dtype && t.shape.ndim() == in[0].shape.ndim())
          << "concat of " << in[0].dtype << " " << in[0].shape << " and " << t.dtype << " " << t.shape;
      for (int64_t d = 0; d < t.shape.ndim(); ++d) {
        TESSEL_CHECK(d == dim || t.shape[d] == in[0].shape[d])
            << "concat along " << dim << ": shapes " << in[0].shape << " and " << t.shape
            << " differ in dimension " << d;
      }
      dims[dim] += t.shape[dim];
    }
    return std::vector<TensorSpec>{{Shape(dims), in[0].dtype}};
  };
  concat.sbp = [splits_except](const std::vector<TensorSpec>& in, const Attrs& a) {
    return splits_except(in[0].shape, in[0].shape.NormalizeAxis(a.Get<int64_t>("dim")), in.size());
  };
  concat.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cpu::Concat(in, a.Get<int64_t>("dim"))};
  };
#ifdef TESSEL_HAS_CUDA
  concat.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    return std::vector<Tensor>{cuda::Concat(ctx.inputs, ctx.attrs.Get<int64_t>("dim"))};
  };
#endif
  concat.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  concat.grad = [](const GradContext& c) {
    int64_t dim = c.inputs[0].shape().NormalizeAxis(c.attrs.Get<int64_t>("dim")), begin = 0;
    std::vector<Tensor> grads;
    for (const Tensor& x : c.inputs) {
      grads.push_back(fn::slice(c.grad_outputs[0], dim, begin, begin + x.shape()[dim]));
      begin += x.shape()[dim];
    }
    return grads;
  };
  RegisterOp(std::move(concat));
}

}  // namespace tessel
