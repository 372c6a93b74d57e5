// Global-tensor operations that communicate: building one from local
// shards (with a metadata check across ranks) and gathering its value.
#pragma once

#include <string>

#include "core/tensor.h"
#include "ops/op_def.h"
#include "sbp/global_tensor.h"

namespace tessel {

// Treats `local` as this rank's shard of a global tensor under `nd_sbp` on
// `placement`. The ranks exchange metadata (one small all-gather over the
// world; every rank calls it): the logical shape is inferred from the shards
// (uneven splits included), a rank outside the placement learns it (it may
// pass an empty shard, or none), and a rank whose placement, NdSbp, dtype or
// shard shape disagrees is named in the error, on every rank, before any
// data moves. For per-step inputs give the logical shape (below): nothing is
// exchanged.
Tensor FromLocal(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp);
// The same with the logical shape given: nothing is exchanged (each member
// checks its own shard against it) unless lockstep checks are on. Ranks
// outside the placement may pass any tensor of the dtype (an undefined one
// reads as f32). For per-step inputs.
Tensor FromLocal(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp,
                 const Shape& logical_shape);

// FromLocal's work on a shard whose logical shape is known, without the op
// (no interpreter, no autograd): what an executable plan's from_local
// instruction runs. Nothing is exchanged unless lockstep checks are on.
Tensor FromLocalShard(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp,
                      const Shape& logical_shape);

// With lockstep checks on: every rank of the world passes a description of
// the call it is making; unless all are equal, every rank throws naming
// which ranks asked for what. A no-op when the checks are off.
void CheckLockstep(const std::string& what, const std::string& request);

// Registers the to_global and from_local ops (idempotent). Tensor::to_global
// and FromLocal apply them through the current interpreter; tessel::Init
// registers them up front so a tracer or a plan reader can look them up.
void EnsureLayoutOps();
// The attributes of a to_global / from_local op to `nd_sbp` on `placement`;
// `grad_sbp`, when given, is the layout its gradient is brought to.
Attrs LayoutAttrs(const Placement& placement, const NdSbp& nd_sbp, const NdSbp* grad_sbp = nullptr);

// The full logical value on every rank of the tensor's placement (partials
// summed); an undefined tensor on other ranks. For tests and checkpoints.
Tensor GatherLogical(const Tensor& global);

}  // namespace tessel
