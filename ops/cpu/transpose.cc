#include "ops/cpu/transpose.h"

#include <cstring>

#include "core/error.h"

namespace tessel::cpu {

Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  const Shape& in = x.shape();
  dim0 = in.NormalizeAxis(dim0);
  dim1 = in.NormalizeAxis(dim1);
  std::vector<int64_t> dims = in.dims();
  std::swap(dims[dim0], dims[dim1]);
  Tensor out = Tensor::Empty(Shape(dims), x.dtype());
  if (dim0 == dim1 || x.numel() == 0) {
    std::memcpy(out.raw_data(), x.raw_data(), x.nbytes());
    return out;
  }
  // Walk the output in order; the input stride of each output dim is the
  // input stride of the dim it came from.
  std::vector<int64_t> in_strides = in.ContiguousStrides(), src(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) src[d] = in_strides[d];
  std::swap(src[dim0], src[dim1]);
  const size_t es = ElementSize(x.dtype());
  const char* from = static_cast<const char*>(x.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  const int64_t n = out.numel(), nd = static_cast<int64_t>(dims.size());
  std::vector<int64_t> idx(nd, 0);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(to + i * es, from + offset * es, es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      offset += src[d];
      if (++idx[d] < dims[d]) break;
      offset -= src[d] * dims[d];
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace tessel::cpu
