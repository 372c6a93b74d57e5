// Data-movement kernels: permute, slice (and its adjoint), concat, cast,
// where. Any dtype unless noted.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cpu {

// out.dims[i] = x.dims[perm[i]].
Tensor Permute(const Tensor& x, const std::vector<int64_t>& perm);
// x[..., begin:end, ...] along `dim`.
Tensor Slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end);
// Zeros of `shape` with `part` placed at begin along `dim` (slice's adjoint).
Tensor PadSlice(const Tensor& part, const Shape& shape, int64_t dim, int64_t begin);
Tensor Concat(const std::vector<Tensor>& xs, int64_t dim);
// The shape of concat(xs, dim); throws naming the pair whose dtype, rank or
// other dimensions differ (the CUDA kernel checks with it too).
Shape ConcatShape(const std::vector<Tensor>& xs, int64_t dim);
Tensor Cast(const Tensor& x, DType dtype);
// cond ? a : b with broadcasting (cond bool; a, b f32).
Tensor Where(const Tensor& cond, const Tensor& a, const Tensor& b);

}  // namespace tessel::cpu
