#include "ops/cpu/reduce.h"

#include <limits>
#include <set>

#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace {
// The keepdim shape of reducing `shape` over `axes`, with the axes normalised.
Shape KeepDimShape(const Shape& shape, const std::vector<int64_t>& axes, std::set<int64_t>* normalized) {
  for (int64_t a : axes) normalized->insert(shape.NormalizeAxis(a));
  if (axes.empty())
    for (int64_t d = 0; d < shape.ndim(); ++d) normalized->insert(d);
  std::vector<int64_t> dims = shape.dims();
  for (int64_t d : *normalized) dims[d] = 1;
  return Shape(dims);
}
}  // namespace

Tensor Reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32)
      << ReduceOpName(op) << " supports f32 on the CPU; got " << x.dtype();
  std::set<int64_t> reduced;
  Shape keep = KeepDimShape(x.shape(), axes, &reduced);
  const int64_t n_out = keep.numel(), n_in = x.numel();
  TESSEL_CHECK(op != ReduceOp::kMax || n_in > 0 || n_out == 0)
      << "max over an empty dimension of " << x.shape() << " has no value";
  std::vector<double> acc(n_out, op == ReduceOp::kMax ? -std::numeric_limits<double>::infinity() : 0.0);
  const float* in = x.data<float>();
  // Reduced axes forming a prefix (bias gradients: sum over rows) or a suffix
  // (per-row sums) reduce with plain strided loops; anything else maps each
  // element to its output.
  int64_t prefix = 0, suffix = 0;
  while (prefix < x.ndim() && reduced.count(prefix)) ++prefix;
  while (suffix < x.ndim() && reduced.count(x.ndim() - 1 - suffix)) ++suffix;
  const bool is_max = op == ReduceOp::kMax;
  if (n_in > 0 && static_cast<int64_t>(reduced.size()) == prefix) {
    const int64_t rows = n_in / n_out;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = in + r * n_out;
      for (int64_t j = 0; j < n_out; ++j)
        acc[j] = is_max ? std::max(acc[j], static_cast<double>(row[j])) : acc[j] + row[j];
    }
  } else if (n_in > 0 && static_cast<int64_t>(reduced.size()) == suffix) {
    const int64_t inner = n_in / n_out;
    ParallelFor(n_out, n_in > 65536, [&](int64_t j) {
      const float* row = in + j * inner;
      double a = acc[j];
      for (int64_t i = 0; i < inner; ++i) a = is_max ? std::max(a, static_cast<double>(row[i])) : a + row[i];
      acc[j] = a;
    });
  } else {
    const BroadcastIndex to_out(keep, x.shape());
    for (int64_t i = 0; i < n_in; ++i) {
      double& a = acc[to_out(i)];
      a = is_max ? std::max(a, static_cast<double>(in[i])) : a + in[i];
    }
  }
  const double count = n_out == 0 ? 1.0 : static_cast<double>(n_in) / static_cast<double>(n_out);
  std::vector<int64_t> out_dims;
  for (int64_t d = 0; d < x.ndim(); ++d)
    if (keepdim || !reduced.count(d)) out_dims.push_back(keep.dims()[d]);
  Tensor out = Tensor::Empty(Shape(out_dims), DType::kFloat32);
  float* o = out.data<float>();
  for (int64_t i = 0; i < n_out; ++i)
    o[i] = static_cast<float>(op == ReduceOp::kMean ? acc[i] / count : acc[i]);
  return out;
}

Tensor ReduceMaxGrad(const Tensor& x, const std::vector<int64_t>& axes, const Tensor& dy_keepdim) {
  std::set<int64_t> reduced;
  Shape keep = KeepDimShape(x.shape(), axes, &reduced);
  TESSEL_CHECK(dy_keepdim.numel() == keep.numel())
      << "max gradient of " << dy_keepdim.shape() << " for a reduction to " << keep;
  Tensor m = Reduce(ReduceOp::kMax, x, axes, true);
  Tensor dx = Tensor::Empty(x.shape(), DType::kFloat32);
  std::vector<bool> taken(keep.numel(), false);
  const BroadcastIndex to_out(keep, x.shape());
  const float* in = x.data<float>();
  const float* mx = m.data<float>();
  const float* g = dy_keepdim.data<float>();
  float* d = dx.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t o = to_out(i);
    bool first_max = in[i] == mx[o] && !taken[o];
    if (first_max) taken[o] = true;
    d[i] = first_max ? g[o] : 0.0f;
  }
  return dx;
}

}  // namespace tessel::cpu
