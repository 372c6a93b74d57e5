// sum, mean and max over axes; sum_to (sum a broadcast result back to a shape);
// expand (the broadcast itself, used by their gradients).
#include "ops/cpu/reduce.h"

#include <cstring>
#include <set>

#include "ops/cpu/broadcast.h"
#include "ops/cpu/elementwise.h"
#include "ops/defs/def_util.h"
#include "ops/functional.h"

#ifdef TESSEL_HAS_CUDA
#include "ops/cuda/elementwise.h"
#include "ops/cuda/reduce.h"
#endif

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::set<int64_t> ReducedAxes(const Shape& shape, const std::vector<int64_t>& axes) {
  std::set<int64_t> out;
  for (int64_t a : axes) out.insert(shape.NormalizeAxis(a));
  if (axes.empty())
    for (int64_t d = 0; d < shape.ndim(); ++d) out.insert(d);
  return out;
}

std::vector<TensorSpec> InferReduce(const std::vector<TensorSpec>& in, const Attrs& a) {
  defs::CheckFloat("sum/mean", in[0], "x");
  const auto& axes = a.Get<std::vector<int64_t>>("axes");
  std::set<int64_t> red = ReducedAxes(in[0].shape, axes);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < in[0].shape.ndim(); ++d) {
    if (!red.count(d))
      dims.push_back(in[0].shape.dims()[d]);
    else if (a.Get<bool>("keepdim"))
      dims.push_back(1);
  }
  return {{Shape(dims), in[0].dtype}};
}

// A split on a reduced dimension leaves partial sums; on a kept one it stays.
std::vector<SbpSignature> SbpReduce(const std::vector<TensorSpec>& in, const Attrs& a) {
  std::set<int64_t> red = ReducedAxes(in[0].shape, a.Get<std::vector<int64_t>>("axes"));
  const bool keepdim = a.Get<bool>("keepdim");
  std::vector<SbpSignature> out = {{{P()}, {P()}}};
  int64_t before = 0;
  for (int64_t d = 0; d < in[0].shape.ndim(); ++d) {
    if (red.count(d)) {
      out.push_back({{S(static_cast<int>(d))}, {P()}});
      ++before;
    } else {
      out.push_back({{S(static_cast<int>(d))}, {S(static_cast<int>(keepdim ? d : d - before))}});
    }
  }
  return out;
}

// expand(g, x.shape) undoing the reduction: g lacks the reduced axes unless keepdim.
Tensor ExpandBack(const Tensor& g, const Tensor& x, const Attrs& a) {
  std::vector<int64_t> missing;
  if (!a.Get<bool>("keepdim")) {
    std::set<int64_t> red = ReducedAxes(x.shape(), a.Get<std::vector<int64_t>>("axes"));
    missing.assign(red.begin(), red.end());
  }
  return ApplyOp("expand", {g}, {{"shape", x.shape().dims()}, {"axes", missing}}).at(0);
}

int64_t ReducedCount(const Shape& shape, const Attrs& a) {
  int64_t n = 1;
  for (int64_t d : ReducedAxes(shape, a.Get<std::vector<int64_t>>("axes"))) n *= shape.dims()[d];
  return n;
}

void RegisterSumMean() {
  OpDef sum;
  sum.name = "sum";
  sum.inputs = {"x"};
  sum.infer = InferReduce;
  sum.sbp = SbpReduce;
  sum.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::Reduce(cpu::ReduceOp::kSum, in[0], a.Get<std::vector<int64_t>>("axes"), a.Get<bool>("keepdim"))};
  };
#ifdef TESSEL_HAS_CUDA
  sum.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::Reduce(cpu::ReduceOp::kSum, in[0], a.Get<std::vector<int64_t>>("axes"),
                                            a.Get<bool>("keepdim"))};
  };
#endif
  sum.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  sum.grad = [](const GradContext& c) {
    return std::vector<Tensor>{ExpandBack(c.grad_outputs[0], c.inputs[0], c.attrs)};
  };
  RegisterOp(std::move(sum));

  OpDef mean;
  mean.name = "mean";
  mean.inputs = {"x"};
  mean.infer = InferReduce;
  mean.sbp = SbpReduce;
  mean.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const auto& axes = a.Get<std::vector<int64_t>>("axes");
    Tensor s = cpu::Reduce(cpu::ReduceOp::kSum, in[0], axes, a.Get<bool>("keepdim"));
    // On shards, divide by the logical count, not the shard's.
    const double divisor = static_cast<double>(ReducedCount(ctx.logical_inputs[0].shape, a));
    return std::vector<Tensor>{cpu::BinaryScalar(cpu::BinaryOp::kMul, s, 1.0 / divisor)};
  };
#ifdef TESSEL_HAS_CUDA
  mean.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const auto& axes = a.Get<std::vector<int64_t>>("axes");
    const double divisor = static_cast<double>(ReducedCount(ctx.logical_inputs[0].shape, a));
    // bf16 and f16 divide the double sum and round once; f32 keeps the
    // CPU's float sum times float(1 / divisor).
    if (in[0].dtype() != DType::kFloat32)
      return std::vector<Tensor>{cuda::Mean(in[0], axes, a.Get<bool>("keepdim"), divisor)};
    Tensor s = cuda::Reduce(cpu::ReduceOp::kSum, in[0], axes, a.Get<bool>("keepdim"));
    return std::vector<Tensor>{cuda::BinaryScalar(cpu::BinaryOp::kMul, s, 1.0 / divisor)};
  };
#endif
  mean.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  mean.grad = [](const GradContext& c) {
    double count = static_cast<double>(ReducedCount(c.inputs[0].shape(), c.attrs));
    return std::vector<Tensor>{
        fn::mul_scalar(ExpandBack(c.grad_outputs[0], c.inputs[0], c.attrs), 1.0 / count)};
  };
  RegisterOp(std::move(mean));
}

// max over axes: a split on a reduced dimension leaves partial maxima.
void RegisterMax() {
  OpDef max;
  max.name = "max";
  max.inputs = {"x"};
  max.infer = InferReduce;
  max.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    std::vector<SbpSignature> out;
    for (SbpSignature s : SbpReduce(in, a)) {
      if (s.inputs[0].is_partial())
        s = {{PMax()}, {PMax()}};
      else if (s.outputs[0].is_partial())
        s.outputs[0] = PMax();
      out.push_back(s);
    }
    return out;
  };
  max.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{
        cpu::Reduce(cpu::ReduceOp::kMax, in[0], a.Get<std::vector<int64_t>>("axes"), a.Get<bool>("keepdim"))};
  };
#ifdef TESSEL_HAS_CUDA
  max.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    return std::vector<Tensor>{cuda::Reduce(cpu::ReduceOp::kMax, in[0], a.Get<std::vector<int64_t>>("axes"),
                                            a.Get<bool>("keepdim"))};
  };
#endif
  // The gradient goes to the positions equal to the maximum, split evenly
  // between ties (as PyTorch's amax does), so the input gradient sums to
  // the output gradient.
  max.saved = OpDef::SavedForGrad{{0}, {0}};  // the gradient reads x and the maximum, to find the ties
  max.grad = [](const GradContext& c) {
    const Tensor& x = c.inputs[0];
    Tensor tie = fn::cast(fn::equal(x, ExpandBack(c.outputs[0], x, c.attrs)), x.dtype());
    Tensor ties = fn::sum(tie, c.attrs.Get<std::vector<int64_t>>("axes"), c.attrs.Get<bool>("keepdim"));
    Tensor share = fn::div(c.grad_outputs[0], ties);
    return std::vector<Tensor>{fn::mul(ExpandBack(share, x, c.attrs), tie)};
  };
  RegisterOp(std::move(max));
}

void RegisterSumTo() {
  OpDef def;
  def.name = "sum_to";
  def.inputs = {"x"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    Shape target(a.Get<std::vector<int64_t>>("shape"));
    TESSEL_CHECK(cpu::BroadcastShapes(target, in[0].shape) == in[0].shape)
        << "sum_to: " << in[0].shape << " is not a broadcast of " << target;
    return std::vector<TensorSpec>{{target, in[0].dtype}};
  };
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& target = a.Get<std::vector<int64_t>>("shape");
    const int64_t lead = in[0].shape.ndim() - static_cast<int64_t>(target.size());
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    for (int64_t d = 0; d < in[0].shape.ndim(); ++d) {
      bool summed = d < lead || (target[d - lead] == 1 && in[0].shape.dims()[d] != 1);
      out.push_back({{S(static_cast<int>(d))}, {summed ? P() : S(static_cast<int>(d - lead))}});
    }
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cpu::SumToShape(in[0], ctx.output_shape(0))};  // this shard's target
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    return std::vector<Tensor>{cuda::SumToShape(in[0], ctx.output_shape(0))};
  };
#endif
  def.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  def.grad = [](const GradContext& c) {
    const int64_t lead = c.inputs[0].ndim() - c.outputs[0].ndim();
    std::vector<int64_t> missing;
    for (int64_t d = 0; d < lead; ++d) missing.push_back(d);
    return ApplyOp("expand", {c.grad_outputs[0]}, {{"shape", c.inputs[0].shape().dims()}, {"axes", missing}});
  };
  RegisterOp(std::move(def));
}

// x with size-1 axes inserted at `axes` (positions in the target), broadcast.
Shape KeepShape(const Shape& x, const std::vector<int64_t>& target, const std::vector<int64_t>& axes) {
  std::vector<int64_t> dims;
  size_t next = 0;
  std::set<int64_t> missing(axes.begin(), axes.end());
  for (size_t o = 0; o < target.size(); ++o) dims.push_back(missing.count(o) ? 1 : x.dims().at(next++));
  return Shape(dims);
}

void RegisterExpand() {
  OpDef def;
  def.name = "expand";
  def.inputs = {"x"};
  def.infer = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& target = a.Get<std::vector<int64_t>>("shape");
    const auto& axes = a.Get<std::vector<int64_t>>("axes");
    TESSEL_CHECK(in[0].shape.ndim() + static_cast<int64_t>(axes.size()) ==
                 static_cast<int64_t>(target.size()))
        << "expand: " << in[0].shape << " plus " << axes.size() << " new axes does not have the rank of "
        << Shape(target);
    Shape keep = KeepShape(in[0].shape, target, axes);
    TESSEL_CHECK(cpu::BroadcastShapes(keep, Shape(target)) == Shape(target))
        << "expand: " << keep << " does not broadcast to " << Shape(target);
    return std::vector<TensorSpec>{{Shape(target), in[0].dtype}};
  };
  def.sbp = [](const std::vector<TensorSpec>& in, const Attrs& a) {
    const auto& target = a.Get<std::vector<int64_t>>("shape");
    std::set<int64_t> missing;
    for (int64_t ax : a.Get<std::vector<int64_t>>("axes")) missing.insert(ax);
    std::vector<SbpSignature> out = {{{P()}, {P()}}};
    int64_t d = 0;
    for (size_t o = 0; o < target.size(); ++o) {
      if (missing.count(o)) continue;
      if (in[0].shape.dims()[d] == target[o])
        out.push_back({{S(static_cast<int>(d))}, {S(static_cast<int>(o))}});
      ++d;
    }
    return out;
  };
  def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const Shape target = ctx.output_shape(0);  // this shard's part of the expanded tensor
    Tensor keep = in[0].Reshape(KeepShape(in[0].shape(), target.dims(), a.Get<std::vector<int64_t>>("axes")));
    Tensor out = Tensor::Empty(target, in[0].dtype());
    cpu::BroadcastIndex index(keep.shape(), out.shape());
    // Elements copied as bytes: any dtype.
    const size_t size = ElementSize(in[0].dtype());
    const auto* src = static_cast<const char*>(keep.raw_data());
    auto* dst = static_cast<char*>(out.raw_data());
    for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(dst + i * size, src + index(i) * size, size);
    return std::vector<Tensor>{out};
  };
#ifdef TESSEL_HAS_CUDA
  def.kernels[DeviceType::kCUDA] = [](const KernelContext& ctx) {
    const std::vector<Tensor>& in = ctx.inputs;
    const Attrs& a = ctx.attrs;
    const Shape target = ctx.output_shape(0);
    Tensor keep = in[0].Reshape(KeepShape(in[0].shape(), target.dims(), a.Get<std::vector<int64_t>>("axes")));
    return std::vector<Tensor>{cuda::BroadcastTo(keep, target)};
  };
#endif
  // The sum over the axes the broadcast added or stretched, in x's shape.
  def.saved = OpDef::SavedForGrad{};  // the gradient reads shapes only
  def.grad = [](const GradContext& c) {
    const Tensor& x = c.inputs[0];
    const auto& target = c.attrs.Get<std::vector<int64_t>>("shape");
    const Shape keep = KeepShape(x.shape(), target, c.attrs.Get<std::vector<int64_t>>("axes"));
    std::vector<int64_t> summed;
    for (int64_t o = 0; o < keep.ndim(); ++o)
      if (keep.dims()[o] == 1 && target[o] != 1) summed.push_back(o);
    Tensor g = c.grad_outputs[0];
    if (!summed.empty()) g = fn::sum(g, summed, /*keepdim=*/true);
    return std::vector<Tensor>{fn::reshape(g, x.shape())};
  };
  RegisterOp(std::move(def));
}

}  // namespace

void RegisterReduceOps() {
  RegisterSumMean();
  RegisterMax();
  RegisterSumTo();
  RegisterExpand();
}

}  // namespace tessel
