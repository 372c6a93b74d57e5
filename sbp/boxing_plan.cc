#include "sbp/boxing_plan.h"

#include <cmath>
#include <map>
#include <mutex>
#include <queue>
#include <sstream>
#include <string>
#include <tuple>

#include "core/error.h"
#include "sbp/slice.h"
#include "sbp/slice_transfer.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {

const char* BoxingOpName(BoxingOp op) {
  switch (op) {
    case BoxingOp::kAllReduce:
      return "all-reduce";
    case BoxingOp::kReduceScatter:
      return "reduce-scatter";
    case BoxingOp::kAllGather:
      return "all-gather";
    case BoxingOp::kAllToAll:
      return "all-to-all";
    case BoxingOp::kLocalSlice:
      return "local slice";
    case BoxingOp::kZeroFill:
      return "zero-fill";
    case BoxingOp::kZeroPad:
      return "zero-pad";
    case BoxingOp::kReinterpret:
      return "reinterpret";
    case BoxingOp::kSliceTransfer:
      return "slice transfer";
  }
  return "?";
}

std::string BoxingStep::Describe() const {
  std::ostringstream os;
  os << BoxingOpName(op);
  if (op == BoxingOp::kAllReduce || op == BoxingOp::kReduceScatter) os << (reduce_max ? " (max)" : " (sum)");
  if (op == BoxingOp::kSliceTransfer) {
    os << " " << from_placement << " " << from << " -> " << to_placement << " " << to;
  } else {
    os << " along mesh axis " << mesh_axis << ": " << from << " -> " << to;
  }
  os << "  [" << static_cast<int64_t>(std::llround(bytes_per_rank)) << " B/rank, " << messages << " msg]";
  return os.str();
}

double BoxingPlan::bytes_per_rank() const {
  double b = 0;
  for (const auto& s : steps) b += s.bytes_per_rank;
  return b;
}

double BoxingPlan::seconds() const {
  double t = 0;
  for (const auto& s : steps) t += s.seconds;
  return t;
}

std::string BoxingPlan::Explain() const {
  std::ostringstream os;
  os << "boxing " << src_placement << " " << src << " -> " << dst_placement << " " << dst << " for " << dtype
     << " " << shape << " (" << shape.numel() * static_cast<int64_t>(ElementSize(dtype)) << " bytes): ";
  if (steps.empty()) return os.str() + "nothing to do";
  os << steps.size() << " step(s), " << static_cast<int64_t>(std::llround(bytes_per_rank()))
     << " bytes sent per rank, est. " << seconds() * 1e3 << " ms";
  for (size_t i = 0; i < steps.size(); ++i) os << "\n  " << i + 1 << ". " << steps[i].Describe();
  return os.str();
}

bool AxisStep(const Placement& placement, const NdSbp& cur, int axis, const Sbp& to, const Shape& shape,
              DType dtype, const BoxingCostModel& model, BoxingStep* step) {
  const Sbp& from = cur[axis];
  if (from == to) return false;
  // Splits nest outermost-first, so the groups along `axis` see a plain 1-D
  // layout only if no inner axis also splits a dimension this step touches.
  for (int j = axis + 1; j < cur.size(); ++j) {
    if (!cur[j].is_split()) continue;
    if (from.is_split(cur[j].axis()) || to.is_split(cur[j].axis())) return false;
  }
  NdSbp next = cur;
  next[axis] = to;
  *step = BoxingStep{};
  step->mesh_axis = axis;
  step->from_placement = step->to_placement = placement;
  step->from = cur;
  step->to = next;

  const double p = static_cast<double>(placement.hierarchy()[axis]);
  if (p == 1) {
    step->op = BoxingOp::kReinterpret;  // a single member holds it all
    return true;
  }
  // T: bytes of the tensor as the group sees it (the largest group's, coord 0).
  NdSbp group_view = cur;
  group_view[axis] = B();
  const double T = static_cast<double>(
      SliceOf(shape, group_view, placement.hierarchy(), std::vector<int64_t>(placement.ndim(), 0)).numel() *
      static_cast<int64_t>(ElementSize(dtype)));
  const int64_t hops = static_cast<int64_t>(p) - 1;
  bool max = from.type() == SbpType::kPartialMax;
  if (from.is_partial() && to.is_broadcast()) {
    step->op = BoxingOp::kAllReduce;
    step->bytes_per_rank = 2 * T * (p - 1) / p;
    step->messages = 2 * hops;
  } else if (from.is_partial() && to.is_split()) {
    step->op = BoxingOp::kReduceScatter;
    step->bytes_per_rank = T * (p - 1) / p;
    step->messages = hops;
  } else if (from.is_split() && to.is_broadcast()) {
    step->op = BoxingOp::kAllGather;
    step->bytes_per_rank = T * (p - 1) / p;
    step->messages = hops;
  } else if (from.is_split() && to.is_split()) {
    step->op = BoxingOp::kAllToAll;
    step->bytes_per_rank = T * (p - 1) / (p * p);
    step->messages = hops;
  } else if (from.is_broadcast() && to.is_split()) {
    step->op = BoxingOp::kLocalSlice;
  } else if (from.is_broadcast() && to.type() == SbpType::kPartialSum) {
    step->op = BoxingOp::kZeroFill;
  } else if (from.is_broadcast() && to.type() == SbpType::kPartialMax) {
    step->op = BoxingOp::kReinterpret;
  } else if (from.is_split() && to.type() == SbpType::kPartialSum) {
    step->op = BoxingOp::kZeroPad;
  } else {
    return false;  // P(sum) <-> P(max), S -> P(max): go through B
  }
  step->reduce_max = max;
  step->seconds = model.Seconds(step->bytes_per_rank, step->messages);
  return true;
}

namespace {

// A transfer step from (src_p, x) to (dst_p, y), costed from its slices.
// The busiest source rank's bytes and messages of a slice transfer. Only
// the meshes' shapes matter when the two placements are the same or share
// no rank (a rank keeps what it holds only where it is on both sides, and
// which holder sends is chosen by position), so those are counted once per
// shape pair and layouts: every boundary of a pipeline is the same count,
// which on thousands of ranks is millions of box overlaps.
std::pair<double, int64_t> TransferLoad(const Placement& src_p, const NdSbp& x, const Placement& dst_p,
                                        const NdSbp& y, const Shape& shape, DType dtype) {
  std::ostringstream key;
  const bool same = src_p == dst_p;
  bool disjoint = !same;
  for (int r : dst_p.ranks()) disjoint = disjoint && !src_p.Contains(r);
  key << (same ? "same " : disjoint ? "disjoint " : "") << x << " " << y << " " << shape << " "
      << ElementSize(dtype);
  auto hierarchy = [&](const Placement& p) {
    for (int64_t d : p.hierarchy()) key << " " << d;
    key << ";";
  };
  hierarchy(src_p);
  hierarchy(dst_p);
  if (!same && !disjoint) key << " " << src_p << " " << dst_p;
  static std::mutex mu;
  static auto* loads = new std::map<std::string, std::pair<double, int64_t>>();
  {
    std::lock_guard<std::mutex> lock(mu);
    auto found = loads->find(key.str());
    if (found != loads->end()) return found->second;
  }
  const SliceTransferLoad counted = CountSliceTransferLoad(src_p, x, dst_p, y, shape);
  const std::pair<double, int64_t> load{
      static_cast<double>(counted.elements * static_cast<int64_t>(ElementSize(dtype))), counted.messages};
  std::lock_guard<std::mutex> lock(mu);
  loads->emplace(key.str(), load);
  return load;
}

BoxingStep TransferStep(const Placement& src_p, const NdSbp& x, const Placement& dst_p, const NdSbp& y,
                        const Shape& shape, DType dtype, const BoxingCostModel& model) {
  BoxingStep step;
  step.op = BoxingOp::kSliceTransfer;
  step.from_placement = src_p;
  step.to_placement = dst_p;
  step.from = x;
  step.to = y;
  std::tie(step.bytes_per_rank, step.messages) = TransferLoad(src_p, x, dst_p, y, shape, dtype);
  step.seconds = model.Seconds(step.bytes_per_rank, step.messages);
  return step;
}

// The Sbp values a mesh axis may take in the search.
std::vector<Sbp> Candidates(const Shape& shape, const NdSbp& src, const NdSbp& dst) {
  std::vector<Sbp> out = {B(), P()};
  for (int d = 0; d < shape.ndim(); ++d) out.push_back(S(d));
  for (const NdSbp* n : {&src, &dst})
    for (const Sbp& s : n->sbps())
      if (s.type() == SbpType::kPartialMax && out.back() != PMax()) out.push_back(PMax());
  return out;
}

// Whether `to` changes the Sbp of an axis whose split of some dimension has
// another axis's split of it nested inside (a later axis splitting the same
// dimension): no collective along that axis alone takes it there.
bool ChangesAnOuterNestedSplit(const NdSbp& from, const NdSbp& to, int64_t ndim) {
  for (int d = 0; d < ndim; ++d) {
    int innermost = -1;
    for (int a = 0; a < from.size(); ++a)
      if (from[a].is_split(d)) innermost = a;
    for (int a = 0; a < innermost; ++a)
      if (from[a].is_split(d) && !(to[a] == from[a])) return true;
  }
  return false;
}

struct State {
  int side;  // 0: source placement, 1: destination placement
  NdSbp nd_sbp;
  bool operator<(const State& o) const { return side != o.side ? side < o.side : nd_sbp < o.nd_sbp; }
  bool operator==(const State& o) const { return side == o.side && nd_sbp == o.nd_sbp; }
};

}  // namespace

BoxingPlan PlanBoxing(const Placement& src_p, const NdSbp& src, const Placement& dst_p, const NdSbp& dst,
                      const Shape& shape, DType dtype, const BoxingCostModel& model) {
  src.Check(shape.ndim(), src_p.ndim());
  dst.Check(shape.ndim(), dst_p.ndim());
  TESSEL_CHECK(src_p.device_type() == dst_p.device_type())
      << "boxing between device types (" << src_p << " -> " << dst_p << ") is not supported; move the tensor "
      << "to the destination device first";
  BoxingPlan plan;
  plan.src_placement = src_p;
  plan.dst_placement = dst_p;
  plan.src = src;
  plan.dst = dst;
  plan.shape = shape;
  plan.dtype = dtype;
  const bool same_placement = src_p == dst_p;
  const State start{0, src}, goal{same_placement ? 0 : 1, dst};
  const Placement* placements[2] = {&src_p, &dst_p};
  const std::vector<Sbp> candidates = Candidates(shape, src, dst);

  // Dijkstra on (seconds, steps): among equally fast routes, fewer steps.
  auto better = [](double s1, int n1, double s2, int n2) {
    if (std::abs(s1 - s2) > 1e-15) return s1 < s2;
    return n1 < n2;
  };
  struct Entry {
    double seconds;
    int steps;
    State state;
  };
  auto later = [&](const Entry& a, const Entry& b) { return better(b.seconds, b.steps, a.seconds, a.steps); };
  std::map<State, std::pair<double, int>> best;
  std::map<State, std::pair<State, BoxingStep>> parent;
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> queue(later);
  best[start] = {0, 0};
  queue.push({0, 0, start});
  auto relax = [&](const Entry& e, const State& next, const BoxingStep& step) {
    double s = e.seconds + step.seconds;
    int n = e.steps + 1;
    auto it = best.find(next);
    if (it != best.end() && !better(s, n, it->second.first, it->second.second)) return;
    best[next] = {s, n};
    parent.insert_or_assign(next, std::make_pair(e.state, step));
    queue.push({s, n, next});
  };
  while (!queue.empty()) {
    Entry e = queue.top();
    queue.pop();
    const auto& b = best.at(e.state);
    if (better(b.first, b.second, e.seconds, e.steps)) continue;  // stale entry
    if (e.state == goal) break;
    const Placement& here = *placements[e.state.side];
    for (int axis = 0; axis < e.state.nd_sbp.size(); ++axis) {
      for (const Sbp& to : candidates) {
        BoxingStep step;
        if (AxisStep(here, e.state.nd_sbp, axis, to, shape, dtype, model, &step)) {
          relax(e, State{e.state.side, step.to}, step);
        }
      }
    }
    if (same_placement && e.state == start && !src.has_partial() && !dst.has_partial() &&
        ChangesAnOuterNestedSplit(src, dst, shape.ndim())) {
      // Straight to the target in slices: what a split nested inside
      // another axis's split needs to be gathered along the outer axis
      // (each rank's part belongs to ranks of another row), which
      // collectives along one axis at a time do only by gathering more
      // than the target holds and slicing it away. Costed like any step, so
      // a collective route as cheap keeps its place; offered from the
      // source only and only where it can help, as the slices cost a pass
      // over every rank pair.
      relax(e, goal, TransferStep(src_p, src, src_p, dst, shape, dtype, model));
    }
    if (e.state.side == 0 && !same_placement && !e.state.nd_sbp.has_partial()) {
      // Hand over to the destination placement, landing either directly on
      // the target (partials replaced by B, restored after) or on the same
      // layout when the meshes have the same rank (the pipeline hop).
      std::vector<NdSbp> targets = {dst.WithoutPartial()};
      if (src_p.ndim() == dst_p.ndim() && e.state.nd_sbp != targets[0]) targets.push_back(e.state.nd_sbp);
      for (const NdSbp& y : targets) {
        relax(e, State{1, y}, TransferStep(src_p, e.state.nd_sbp, dst_p, y, shape, dtype, model));
      }
    }
  }
  TESSEL_CHECK_CODE(best.count(goal), StatusCode::kInternal)
      << "no boxing route from " << src_p << " " << src << " to " << dst_p << " " << dst << " for shape "
      << shape;
  for (State s = goal; !(s == start);) {
    const auto& [prev, step] = parent.at(s);
    plan.steps.insert(plan.steps.begin(), step);
    s = prev;
  }
  return plan;
}

}  // namespace tessel
