#include "ops/cpu/tensor_ops.h"

#include <cstring>

#include "core/box_copy.h"
#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

Tensor Permute(const Tensor& x, const std::vector<int64_t>& perm) {
  const Shape& in = x.shape();
  TESSEL_CHECK(static_cast<int64_t>(perm.size()) == in.ndim())
      << "permute of " << in << " needs " << in.ndim() << " axes, got " << perm.size();
  std::vector<int64_t> dims(perm.size()), src(perm.size());
  std::vector<bool> seen(perm.size(), false);
  const std::vector<int64_t> in_strides = in.ContiguousStrides();
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = in.NormalizeAxis(perm[i]);
    TESSEL_CHECK(!seen[p]) << "permute lists axis " << p << " twice";
    seen[p] = true;
    dims[i] = in.dims()[p];
    src[i] = in_strides[p];
  }
  Tensor out = Tensor::Empty(Shape(dims), x.dtype());
  const size_t es = ElementSize(x.dtype());
  const char* from = static_cast<const char*>(x.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  const int64_t nd = static_cast<int64_t>(dims.size());
  if (out.numel() == 0) return out;
  // When the last axis stays last, whole rows are contiguous in both: copy
  // rows; otherwise copy element by element.
  const bool rows = nd > 0 && src[nd - 1] == 1;
  const int64_t run = rows ? dims[nd - 1] : 1, outer_nd = rows ? nd - 1 : nd;
  const int64_t n = out.numel() / run;
  std::vector<int64_t> idx(outer_nd, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(to + i * run * es, from + offset * es, run * es);
    for (int64_t d = outer_nd - 1; d >= 0; --d) {
      offset += src[d];
      if (++idx[d] < dims[d]) break;
      offset -= src[d] * dims[d];
      idx[d] = 0;
    }
  }
  return out;
}

Tensor Slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end) {
  dim = x.shape().NormalizeAxis(dim);
  const int64_t size = x.shape().dims()[dim];
  TESSEL_CHECK(0 <= begin && begin <= end && end <= size)
      << "slice [" << begin << ":" << end << "] of dimension " << dim << " (size " << size << ") of "
      << x.shape();
  std::vector<int64_t> dims = x.shape().dims(), offset(dims.size(), 0);
  dims[dim] = end - begin;
  offset[dim] = begin;
  Tensor out = Tensor::Empty(Shape(dims), x.dtype());
  CopyBox(x.raw_data(), x.shape().dims(), offset, out.raw_data(), dims, std::vector<int64_t>(dims.size(), 0),
          dims, ElementSize(x.dtype()));
  return out;
}

Tensor PadSlice(const Tensor& part, const Shape& shape, int64_t dim, int64_t begin) {
  dim = shape.NormalizeAxis(dim);
  Tensor out = Tensor::Empty(shape, part.dtype());
  if (out.nbytes() > 0) std::memset(out.raw_data(), 0, out.nbytes());
  std::vector<int64_t> offset(shape.ndim(), 0);
  offset[dim] = begin;
  CopyBox(part.raw_data(), part.shape().dims(), std::vector<int64_t>(shape.ndim(), 0), out.raw_data(),
          shape.dims(), offset, part.shape().dims(), ElementSize(part.dtype()));
  return out;
}

Shape ConcatShape(const std::vector<Tensor>& xs, int64_t dim) {
  TESSEL_CHECK(!xs.empty()) << "concat of no tensors";
  dim = xs[0].shape().NormalizeAxis(dim);
  std::vector<int64_t> dims = xs[0].shape().dims();
  dims[dim] = 0;
  for (const Tensor& x : xs) {
    std::vector<int64_t> d = x.shape().dims();
    TESSEL_CHECK(x.dtype() == xs[0].dtype() && d.size() == dims.size())
        << "concat of " << xs[0].ToString() << " and " << x.ToString();
    for (size_t i = 0; i < d.size(); ++i) {
      TESSEL_CHECK(static_cast<int64_t>(i) == dim || d[i] == xs[0].shape().dims()[i])
          << "concat along " << dim << ": shapes " << xs[0].shape() << " and " << x.shape()
          << " differ in dimension " << i;
    }
    dims[dim] += d[dim];
  }
  return Shape(dims);
}

Tensor Concat(const std::vector<Tensor>& xs, int64_t dim) {
  const Shape shape = ConcatShape(xs, dim);
  dim = xs[0].shape().NormalizeAxis(dim);
  Tensor out = Tensor::Empty(shape, xs[0].dtype());
  const std::vector<int64_t>& dims = shape.dims();
  std::vector<int64_t> offset(dims.size(), 0);
  for (const Tensor& x : xs) {
    CopyBox(x.raw_data(), x.shape().dims(), std::vector<int64_t>(dims.size(), 0), out.raw_data(), dims,
            offset, x.shape().dims(), ElementSize(x.dtype()));
    offset[dim] += x.shape().dims()[dim];
  }
  return out;
}

Tensor Cast(const Tensor& x, DType dtype) {
  Tensor out = Tensor::Empty(x.shape(), dtype);
  const int64_t n = x.numel();
  VisitDType(x.dtype(), [&](auto from) {
    using F = decltype(from);
    const F* in = static_cast<const F*>(x.raw_data());
    VisitDType(dtype, [&](auto to) {
      using T = decltype(to);
      T* o = static_cast<T*>(out.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        float v;
        if constexpr (std::is_same_v<F, Float16> || std::is_same_v<F, BFloat16>) {
          v = static_cast<float>(in[i]);
        } else {
          v = static_cast<float>(in[i]);
        }
        if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
          o[i] = T(v);
        } else if constexpr (std::is_same_v<F, int64_t> && std::is_same_v<T, int64_t>) {
          o[i] = in[i];
        } else {
          o[i] = static_cast<T>(v);
        }
      }
    });
  });
  return out;
}

Tensor Where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(cond.dtype() == DType::kBool && a.dtype() == DType::kFloat32 && b.dtype() == DType::kFloat32)
      << "where needs a bool condition and f32 values; got " << cond.dtype() << ", " << a.dtype() << ", "
      << b.dtype();
  Shape shape = BroadcastShapes(BroadcastShapes(cond.shape(), a.shape()), b.shape());
  Tensor out = Tensor::Empty(shape, DType::kFloat32);
  BroadcastIndex ic(cond.shape(), shape), ia(a.shape(), shape), ib(b.shape(), shape);
  const bool* c = cond.data<bool>();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* o = out.data<float>();
  // Row by row over the last dimension: each operand's row starts at its
  // broadcast index and steps by 1 or 0, so the inner loop does no index
  // arithmetic (an index per element was a tenth of a small GPT's step).
  const int64_t cols = shape.ndim() == 0 ? 1 : shape[-1], rows = cols == 0 ? 0 : shape.numel() / cols;
  const int64_t sc = ic.inner_stride(), sa = ia.inner_stride(), sb = ib.inner_stride();
  ParallelFor(rows, rows * cols > 32768, [&](int64_t r) {
    const bool* cr = c + ic(r * cols);
    const float* ar = pa + ia(r * cols);
    const float* br = pb + ib(r * cols);
    float* orow = o + r * cols;
    for (int64_t j = 0; j < cols; ++j) orow[j] = cr[j * sc] ? ar[j * sa] : br[j * sb];
  });
  return out;
}

}  // namespace tessel::cpu
