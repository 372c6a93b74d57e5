// Point-to-point slice transfers: how ranks of one placement hand a
// non-partial layout to ranks of another (or the same) placement.
#pragma once

#include <vector>

#include "sbp/placement.h"
#include "sbp/slice.h"

namespace tessel {

struct SliceTransfer {
  int src_rank;  // world ranks
  int dst_rank;
  Box box;  // logical box moved (never empty)
};

// Every destination rank receives exactly its box under `dst` on `dst_p`,
// each part from one holder under `src` on `src_p`: itself when it holds
// the part (a local copy), otherwise a replica chosen by the destination's
// index so that broadcast copies share the sending. Deterministic: every
// rank computes the same list. Neither layout may be partial.
std::vector<SliceTransfer> PlanSliceTransfers(const Placement& src_p, const NdSbp& src,
                                              const Placement& dst_p, const NdSbp& dst, const Shape& shape);

// What the busiest sender of PlanSliceTransfers's transfers sends (copies
// a rank makes to itself not counted): the most elements and the most
// messages of any source rank. Counted without listing the transfers —
// overlaps once per distinct destination box, then a count per
// destination rank — since a layout change between two thousand-rank
// meshes can be millions of them, and the boxing planner weighs many.
struct SliceTransferLoad {
  int64_t elements = 0;
  int64_t messages = 0;
};
SliceTransferLoad CountSliceTransferLoad(const Placement& src_p, const NdSbp& src, const Placement& dst_p,
                                         const NdSbp& dst, const Shape& shape);

}  // namespace tessel
