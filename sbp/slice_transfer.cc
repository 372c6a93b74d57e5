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

SliceTransferLoad CountSliceTransferLoad(const Placement& src_p, const NdSbp& src, const Placement& dst_p,
                                         const NdSbp& dst, const Shape& shape) {
  TESSEL_CHECK(!src.has_partial() && !dst.has_partial())
      << "slice transfers move non-partial layouts; got " << src << " -> " << dst;
  // Distinct boxes on each side, with their holders (source: positions in
  // src_p, as PlanSliceTransfers orders them; destination: positions j).
  std::map<Box, std::vector<int>> holders, wanted_by;
  for (int i = 0; i < src_p.size(); ++i) holders[SliceOf(shape, src, src_p.hierarchy(), src_p.Coord(i))].push_back(i);
  for (int j = 0; j < dst_p.size(); ++j) wanted_by[SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(j))].push_back(j);
  struct Source {
    const Box* box;
    const std::vector<int>* positions;
    std::vector<int> sorted_ranks;
  };
  std::vector<Source> sources;
  sources.reserve(holders.size());
  for (const auto& [box, positions] : holders) {
    Source source{&box, &positions, {}};
    for (int i : positions) source.sorted_ranks.push_back(src_p.ranks()[static_cast<size_t>(i)]);
    std::sort(source.sorted_ranks.begin(), source.sorted_ranks.end());
    sources.push_back(std::move(source));
  }
  std::vector<int64_t> elements(static_cast<size_t>(src_p.size()), 0), messages(elements.size(), 0);
  std::vector<std::pair<size_t, int64_t>> overlaps;  // (source, elements) of one destination box
  for (const auto& [want, js] : wanted_by) {
    overlaps.clear();
    // (Dimension 0's ranges partition it: see PlanSliceTransfers.)
    auto first = sources.begin();
    if (want.ndim() > 0)
      first = std::partition_point(sources.begin(), sources.end(),
                                   [&](const Source& s) { return (*s.box)[0].end <= want[0].begin; });
    for (auto it = first; it != sources.end(); ++it) {
      const Box& box = *it->box;
      if (want.ndim() > 0 && box[0].begin >= want[0].end) break;
      int64_t numel = 1;
      for (int64_t d = 0; d < want.ndim() && numel > 0; ++d)
        numel *= std::max<int64_t>(0, std::min(box[d].end, want[d].end) - std::max(box[d].begin, want[d].begin));
      if (numel > 0) overlaps.emplace_back(static_cast<size_t>(it - sources.begin()), numel);
    }
    for (int j : js) {
      const int dst_rank = dst_p.ranks()[static_cast<size_t>(j)];
      for (const auto& [s, numel] : overlaps) {
        const Source& source = sources[s];
        if (std::binary_search(source.sorted_ranks.begin(), source.sorted_ranks.end(), dst_rank)) continue;
        const std::vector<int>& positions = *source.positions;
        const size_t from = static_cast<size_t>(positions[static_cast<size_t>(j) % positions.size()]);
        elements[from] += numel;
        ++messages[from];
      }
    }
  }
  SliceTransferLoad load;
  for (size_t i = 0; i < elements.size(); ++i) {
    load.elements = std::max(load.elements, elements[i]);
    load.messages = std::max(load.messages, messages[i]);
  }
  return load;
}

}  // namespace tessel
