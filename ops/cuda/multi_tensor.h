// Many tensors in one launch: the optimizer step touches every parameter
// several times (widen and unscale the gradients, their norm, clip them,
// the AdamW update, narrow the updated masters), and one small op per
// parameter costs more in host dispatch than the GPU spends on the data
// (GPT-2 medium: ~1,500 launches per step). These walk a table of (source, destination, count)
// chunks instead. Local CUDA tensors (a rank's shards), same count each pair.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

// dst[i] = f32(src[i]) * scale for every pair (src f32, bf16 or f16; dst
// f32), and returns the 2-norm of all of dst as an f32 scalar on the
// device: sums of squares in double, added in a fixed order.
Tensor UnscaleAndNorm(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double scale);
// dst[i] = (src[i] * scale) rounded to dst's dtype (src f32; dst f32, bf16
// or f16; the product in f32, as mul_scalar's). src and dst may be the same
// tensors.
void CastInto(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, double scale = 1.0);

// One AdamW step of many parameters: what adamw_update does to each, bit
// for bit. Every tensor f32 except the i64 step scalars (each counted up
// first); lr an f32 scalar on the device; one weight decay per parameter.
struct AdamWGroup {
  std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  std::vector<double> weight_decays;
};
void AdamWStep(const AdamWGroup& group, const Tensor& lr, double beta1, double beta2, double eps);

}  // namespace tessel::cuda
