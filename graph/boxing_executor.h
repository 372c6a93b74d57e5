// Carries out a boxing plan (sbp/boxing_plan.h) with the communicator.
#pragma once

#include <memory>

#include "core/tensor.h"
#include "sbp/boxing_plan.h"

namespace tessel {

// `input` must be a global tensor laid out as the plan's source; returns it
// laid out as the plan's destination. Every rank of the world calls it in
// lockstep; ranks outside a step's placement skip that step.
Tensor ExecuteBoxing(const Tensor& input, const BoxingPlan& plan);

// `input` (global) laid out as `nd_sbp` on `placement`, without recording
// autograd: what the to_global op and the eager interpreter's input
// conversions run. Checks the layout fits the shape; with lockstep checks
// on, the ranks first agree on the request (core/init.h). The same layout
// returns the input's data, detached.
Tensor BoxTo(const Tensor& input, const Placement& placement, const NdSbp& nd_sbp);

// The plan for a conversion, cached by (layouts, shape, dtype) in a cache of
// at most kBoxingPlanCacheCapacity plans (least recently used evicted).
constexpr size_t kBoxingPlanCacheCapacity = 4096;
std::shared_ptr<const BoxingPlan> GetBoxingPlan(const Placement& src_placement, const NdSbp& src,
                                                const Placement& dst_placement, const NdSbp& dst,
                                                const Shape& shape, DType dtype);
// Plans cached now (for tests and reports).
size_t BoxingPlanCacheSize();

}  // namespace tessel
