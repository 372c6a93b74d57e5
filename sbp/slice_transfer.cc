#include "sbp/slice_transfer.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/error.h"

namespace tessel {

namespace {

// A distinct box the source ranks hold, with its holders: positions in the
// source placement (in placement order) and their world ranks, sorted.
struct Source {
  Box box;
  std::vector<int> positions;
  std::vector<int> sorted_ranks;
  bool Holds(int rank) const { return std::binary_search(sorted_ranks.begin(), sorted_ranks.end(), rank); }
};

// The distinct boxes (they tile the tensor) in Box order: by dimension 0's
// range first.
std::vector<Source> SourceBoxes(const Placement& src_p, const NdSbp& src, const Shape& shape) {
  std::map<Box, std::vector<int>> holders;
  for (int i = 0; i < src_p.size(); ++i) holders[SliceOf(shape, src, src_p.hierarchy(), src_p.Coord(i))].push_back(i);
  std::vector<Source> sources;
  sources.reserve(holders.size());
  for (auto& [box, positions] : holders) {
    Source source{box, std::move(positions), {}};
    for (int i : source.positions) source.sorted_ranks.push_back(src_p.ranks()[static_cast<size_t>(i)]);
    std::sort(source.sorted_ranks.begin(), source.sorted_ranks.end());
    sources.push_back(std::move(source));
  }
  return sources;
}

// Calls fn(source) for the sources whose box may overlap `want`, in order.
// The boxes' ranges of dimension 0 partition it (nested balanced splits,
// or the whole), so their ends grow with their begins: only the run
// overlapping `want` there is visited — on a world of thousands of ranks,
// a few boxes rather than every one.
template <typename F>
void ForEachAlongside(const std::vector<Source>& sources, const Box& want, F fn) {
  auto first = sources.begin();
  if (want.ndim() > 0)
    first = std::partition_point(sources.begin(), sources.end(),
                                 [&](const Source& s) { return s.box[0].end <= want[0].begin; });
  for (auto it = first; it != sources.end(); ++it) {
    if (want.ndim() > 0 && it->box[0].begin >= want[0].end) break;
    fn(*it);
  }
}

// The holder that sends `source`'s part to destination position j, by its
// position in the source placement: a replica chosen by j so that replicas
// share the sending; -1 when the destination holds the part itself.
int SenderPosition(const Source& source, int j, int dst_rank) {
  if (source.Holds(dst_rank)) return -1;
  return source.positions[static_cast<size_t>(j) % source.positions.size()];
}

}  // namespace

std::vector<SliceTransfer> PlanSliceTransfers(const Placement& src_p, const NdSbp& src,
                                              const Placement& dst_p, const NdSbp& dst, const Shape& shape) {
  TESSEL_CHECK(!src.has_partial() && !dst.has_partial())
      << "slice transfers move non-partial layouts; got " << src << " -> " << dst;
  const std::vector<Source> sources = SourceBoxes(src_p, src, shape);
  std::vector<SliceTransfer> transfers;
  for (int j = 0; j < dst_p.size(); ++j) {
    const int dst_rank = dst_p.ranks()[static_cast<size_t>(j)];
    const Box want = SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(j));
    ForEachAlongside(sources, want, [&](const Source& source) {
      Box part = source.box.Intersect(want);
      if (part.empty()) return;
      const int sender = SenderPosition(source, j, dst_rank);
      transfers.push_back(
          {sender < 0 ? dst_rank : src_p.ranks()[static_cast<size_t>(sender)], dst_rank, std::move(part)});
    });
  }
  return transfers;
}

SliceTransferLoad CountSliceTransferLoad(const Placement& src_p, const NdSbp& src, const Placement& dst_p,
                                         const NdSbp& dst, const Shape& shape) {
  TESSEL_CHECK(!src.has_partial() && !dst.has_partial())
      << "slice transfers move non-partial layouts; got " << src << " -> " << dst;
  const std::vector<Source> sources = SourceBoxes(src_p, src, shape);
  // Destination positions by the box they want: overlaps once per box.
  std::map<Box, std::vector<int>> wanted_by;
  for (int j = 0; j < dst_p.size(); ++j) wanted_by[SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(j))].push_back(j);
  // By the sender's position in the source placement.
  std::vector<int64_t> elements(static_cast<size_t>(src_p.size()), 0), messages(elements.size(), 0);
  std::vector<std::pair<const Source*, int64_t>> overlaps;  // of one destination box: (source, elements)
  for (const auto& wanted : wanted_by) {
    const Box& want = wanted.first;  // (named: a lambda below reads it)
    const std::vector<int>& js = wanted.second;
    overlaps.clear();
    ForEachAlongside(sources, want, [&](const Source& source) {
      int64_t numel = 1;
      for (int64_t d = 0; d < want.ndim() && numel > 0; ++d)
        numel *= std::max<int64_t>(
            0, std::min(source.box[d].end, want[d].end) - std::max(source.box[d].begin, want[d].begin));
      if (numel > 0) overlaps.emplace_back(&source, numel);
    });
    for (int j : js) {
      const int dst_rank = dst_p.ranks()[static_cast<size_t>(j)];
      for (const auto& [source, numel] : overlaps) {
        const int sender = SenderPosition(*source, j, dst_rank);
        if (sender < 0) continue;  // a copy to itself
        elements[static_cast<size_t>(sender)] += numel;
        ++messages[static_cast<size_t>(sender)];
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
