// CUDA data-movement kernels: permute, slice (and its adjoint), concat and
// micro-batch row selection, for any dtype (elements are copied as opaque
// bytes). Same signatures and checks as the CPU twins in ops/cpu/tensor_ops.h.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

// out.dims[i] = x.dims[perm[i]].
Tensor Permute(const Tensor& x, const std::vector<int64_t>& perm);
// x[..., begin:end, ...] along `dim`.
Tensor Slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end);
// Zeros of `shape` with `part` placed at begin along `dim` (slice's adjoint).
Tensor PadSlice(const Tensor& part, const Shape& shape, int64_t dim, int64_t begin);
Tensor Concat(const std::vector<Tensor>& xs, int64_t dim);
// Rows [b * block_rows + index * chunk, + chunk) of x for each block b of x's
// rows, in block order (the micro_batch op on this rank's rows; chunk =
// block_rows / count). One strided copy instead of slices and a concat.
Tensor MicroBatch(const Tensor& x, int64_t block_rows, int64_t index, int64_t count);

}  // namespace tessel::cuda
