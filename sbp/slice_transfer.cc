#include "sbp/slice_transfer.h"

#include <algorithm>
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
  struct Source {
    const Box* box;
    const std::vector<int>* ranks;
    std::vector<int> sorted;  // the same ranks, to look one up
  };
  std::vector<Source> sources;  // in Box order: by dimension 0's range first
  sources.reserve(holders.size());
  for (const auto& [box, ranks] : holders) {
    sources.push_back({&box, &ranks, ranks});
    std::sort(sources.back().sorted.begin(), sources.back().sorted.end());
  }
  std::vector<SliceTransfer> transfers;
  for (int j = 0; j < dst_p.size(); ++j) {
    int dst_rank = dst_p.ranks()[j];
    Box want = SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(j));
    // The source boxes' ranges of dimension 0 partition it (nested balanced
    // splits, or the whole), so their ends grow with their begins: only the
    // run of boxes overlapping `want` there need intersecting — on a world
    // of thousands of ranks, a few boxes rather than every one.
    auto first = sources.begin();
    if (want.ndim() > 0)
      first = std::partition_point(sources.begin(), sources.end(),
                                   [&](const Source& s) { return (*s.box)[0].end <= want[0].begin; });
    for (auto it = first; it != sources.end(); ++it) {
      const Box& box = *it->box;
      if (want.ndim() > 0 && box[0].begin >= want[0].end) break;
      Box part = box.Intersect(want);
      if (part.empty()) continue;
      const std::vector<int>& ranks = *it->ranks;
      const bool holds = std::binary_search(it->sorted.begin(), it->sorted.end(), dst_rank);
      const int src_rank = holds ? dst_rank : ranks[static_cast<size_t>(j) % ranks.size()];
      transfers.push_back({src_rank, dst_rank, part});
    }
  }
  return transfers;
}

}  // namespace tessel
