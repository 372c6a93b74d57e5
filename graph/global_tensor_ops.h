// Global-tensor operations that communicate: building one from local
// shards (with a metadata check across ranks) and gathering its value.
#pragma once

#include "core/tensor.h"
#include "sbp/global_tensor.h"

namespace tessel {

// Treats `local` as this rank's shard of a global tensor under `nd_sbp` on
// `placement`. Ranks exchange metadata (collective over the world): the
// logical shape is inferred from the shards (uneven splits included), and a
// rank whose placement, NdSbp, dtype or shard shape disagrees is named in
// the error.
Tensor FromLocal(const Tensor& local, const Placement& placement, const NdSbp& nd_sbp);

// The full logical value on every rank of the tensor's placement (partials
// summed); an undefined tensor on other ranks. For tests and checkpoints.
Tensor GatherLogical(const Tensor& global);

}  // namespace tessel
