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

}  // namespace tessel
