// Many tensors in one launch: the mixed-precision optimizer step touches
// every parameter three times (widen and unscale the gradients, their
// norm, narrow the updated masters), and one small op per parameter costs
// more in host dispatch than the GPU spends on the data (GPT-2 medium: ~900
// launches per step). These walk a table of (source, destination, count)
// chunks instead. Local CUDA tensors (a rank's shards), same count each pair.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

// dst[i] = f32(src[i]) * scale for every pair (src f32, bf16 or f16; dst
// f32), and returns the 2-norm of all of dst as an f32 scalar on the
// device: sums of squares in double, added in a fixed order.
Tensor UnscaleAndNorm(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double scale);
// dst[i] = src[i] rounded to dst's dtype (src f32; dst f32, bf16 or f16).
void CastInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst);

}  // namespace tessel::cuda
