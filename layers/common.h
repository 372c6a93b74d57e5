// Small helpers shared by the layers.
#pragma once

#include "core/tensor.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

namespace tessel::layers {

// `x` (local or global) as a global tensor on `placement` in the layout
// of a batch input (dist::BatchInputSbp: batch split over dp, replicated
// over tp; or the sequence split over dp). Differentiable.
Tensor ToHidden(const Tensor& x, const Placement& placement);
// Hidden states `x` on `placement` in dist::GetActivationSbp (sequence split
// over tp under sequence parallelism). Differentiable.
Tensor ToActivations(const Tensor& x, const Placement& placement);

// A value a layer reads beside its activations (a mask, positions, a
// position bias) on `placement`: undefined stays so; a local tensor (the
// whole value on every rank: nothing to exchange) becomes global,
// replicated; a global one on another placement (an earlier pipeline
// stage's) moves there in its layout. Differentiable.
Tensor OnPlacement(const Tensor& x, const Placement& placement);

// A language model's token inputs checked before any work: ids [batch,
// seq] with seq <= max_seq, and position_ids and attention_mask (each
// optional) of the ids' shape; throws naming `model` and the shapes.
void CheckTokenInputs(const char* model, const Tensor& ids, const Tensor& position_ids,
                      const Tensor& attention_mask, int64_t max_seq);
// position_ids, or (undefined) the positions 0 .. seq - 1 every row shares,
// [seq], local.
Tensor PositionsOrRange(const Tensor& position_ids, int64_t seq);

// A parameter as a layer computes with it. Under ZeRO stage 3 it is stored
// split over dp (dist::GetParameterNdSbp) and gathered here: an all-gather
// forward, its gradient reduce-scattered back into the stored layout. Under
// stage 2 it is used as stored, but its gradient is reduce-scattered here
// into dist::ZeroShardSbp as each use's gradient arrives, so no rank keeps
// a whole gradient. Otherwise the parameter itself. Every use of a
// parameter in layers/ and models/ goes through it.
Tensor ForCompute(const Tensor& param);
// A parameter (ForCompute's) gathered to `compute` for a layer's product
// (the multi-axis tensor-parallel modes). Its gradient comes back in the
// parameter's layout but partial over dp: the data-parallel reduction stays
// the optimizer's (bucketed, or ZeRO's reduce-scatter), as for a parameter
// used where it is kept.
Tensor GatheredForCompute(const Tensor& param, const NdSbp& compute);
// A product partial over some mesh axes (`y`) reduced into `out`; its
// gradient is gathered back along those axes once, for both gradient
// products to read (left to each, they gather it twice or trade the
// gather for costlier moves of their other operand).
Tensor ReducedInto(const Tensor& y, const NdSbp& out);

}  // namespace tessel::layers
