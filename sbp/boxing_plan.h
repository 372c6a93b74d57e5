// The boxing planner: turns (placement A, NdSbp A) into (placement B,
// NdSbp B) as a list of primitive steps, each with its cost under a ring
// model, found by a shortest-path search over intermediate NdSbps.
//
// Pure logic: it communicates nothing and runs in one process. The
// executor (graph/boxing_executor.h) carries a plan out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

namespace tessel {

enum class BoxingOp {
  kAllReduce,      // P -> B along one mesh axis
  kReduceScatter,  // P -> S(d)
  kAllGather,      // S(d) -> B
  kAllToAll,       // S(i) -> S(j)
  kLocalSlice,     // B -> S(d): keep one's own part, no communication
  kZeroFill,       // B -> P: group rank 0 keeps the value, the others hold zeros
  kZeroPad,        // S(d) -> P: one's part inside zeros of the full extent
  kReinterpret,    // same data, new name (a mesh axis of size 1, or B -> P(max))
  kSliceTransfer,  // point-to-point slices between placements or layouts
};
const char* BoxingOpName(BoxingOp op);

// Time of a step = bytes / bandwidth + messages * latency, per rank.
struct BoxingCostModel {
  double bandwidth_bytes_per_s = 1e9;
  double latency_s = 20e-6;
  double Seconds(double bytes, int64_t messages) const {
    return bytes / bandwidth_bytes_per_s + static_cast<double>(messages) * latency_s;
  }
};

struct BoxingStep {
  BoxingOp op = BoxingOp::kReinterpret;
  int mesh_axis = -1;  // collective and local steps: the mesh axis that changes
  Placement from_placement, to_placement;
  NdSbp from, to;
  bool reduce_max = false;    // all-reduce / reduce-scatter of a P(max) value
  double bytes_per_rank = 0;  // most bytes one rank sends (ring model)
  int64_t messages = 0;       // most messages one rank sends
  double seconds = 0;
  std::string Describe() const;
};

struct BoxingPlan {
  Placement src_placement, dst_placement;
  NdSbp src, dst;
  Shape shape;
  DType dtype = DType::kFloat32;
  std::vector<BoxingStep> steps;

  double bytes_per_rank() const;
  double seconds() const;
  // The plan in words, one line per step, with its cost.
  std::string Explain() const;
};

// Plans the conversion. Throws naming the offending value if either side is
// invalid for `shape` (split axis out of range, wrong NdSbp length, ...).
BoxingPlan PlanBoxing(const Placement& src_placement, const NdSbp& src, const Placement& dst_placement,
                      const NdSbp& dst, const Shape& shape, DType dtype, const BoxingCostModel& model = {});

// The single-step conversion along `axis` from `cur` to `cur` with entry
// `axis` set to `to`, if one primitive does it (exposed for tests).
bool AxisStep(const Placement& placement, const NdSbp& cur, int axis, const Sbp& to, const Shape& shape,
              DType dtype, const BoxingCostModel& model, BoxingStep* step);

}  // namespace tessel
