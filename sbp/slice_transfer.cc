#include "sbp/slice_transfer.h"

#include <map>

#include "core/error.h"

namespace tessel {

std::vector<SliceTransfer> PlanSliceTransfers(const Placement& src_p, const NdSbp& src,
                                              const Placement& dst_p, const NdSbp& dst, const Shape& shape) {
  TESSEL_CHECK(!src.has_partial() && !dst.has_partial())
      << "slice transfers move non-partial layouts; got " << src << " -> " << dst;
  // Distinct source boxes (they tile the tensor) and the ranks holding each.
  std::map<Box, std::vector<int>> holders;
  for (int i = 0; i < src_p.size(); ++i) {
    holders[SliceOf(shape, src, src_p.hierarchy(), src_p.Coord(i))].push_back(src_p.ranks()[i]);
  }
  std::vector<SliceTransfer> transfers;
  for (int j = 0; j < dst_p.size(); ++j) {
    int dst_rank = dst_p.ranks()[j];
    Box want = SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(j));
    for (const auto& [box, ranks] : holders) {
      Box part = box.Intersect(want);
      if (part.empty()) continue;
      int src_rank = ranks[j % ranks.size()];
      for (int r : ranks)
        if (r == dst_rank) src_rank = r;
      transfers.push_back({src_rank, dst_rank, part});
    }
  }
  return transfers;
}

}  // namespace tessel
