// Small helpers shared by the layers.
#pragma once

#include "core/tensor.h"
#include "sbp/placement.h"

namespace tessel::layers {

// `x` (local or global) as a global tensor on `placement` in the hidden
// layout: batch split over dp, replicated over tp. Differentiable.
Tensor ToHidden(const Tensor& x, const Placement& placement);

}  // namespace tessel::layers
