// Exhaustive boxing check. For every source and destination NdSbp (S over
// every tensor dimension, B, P) it builds a tensor under the source layout
// (P sources are split into summands that add up to the original), converts
// it with to_global and checks every rank's shard against SliceOf and the
// sums across ranks against the original (see CheckPair): the check itself
// uses no boxing. Launched with tessel-launch; --suite picks
//   mesh:  one mesh (--mesh 2,2) and its placement over all ranks
//   cross: conversions between different placements (needs 6 ranks)
#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cmath>
#include <sstream>

#include "core/comm/process_group.h"
#include "graph/boxing_executor.h"
#include "graph/global_tensor_ops.h"
#include "graph/init.h"
#include "sbp/boxing_plan.h"
#include "tests/testing/test_util.h"

DEFINE_string(suite, "mesh", "mesh or cross");
DEFINE_string(mesh, "4", "Mesh shape for --suite=mesh, e.g. 2,2 (its product must be the world size)");
DEFINE_string(shapes, "7,5,3", "Tensor shapes to test, ';'-separated, e.g. '7,5,3;5,1,3'");

namespace tessel {
namespace {

using testing::AllNdSbps;

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// The original: element i is i (exact in f32 for these sizes). Under P the
// ranks along the partial axes hold v - (m-1)k and k (k varies per element),
// which sum to v but are each wrong alone.
Tensor MakeSource(const Shape& shape, const Placement& placement, const NdSbp& nd_sbp) {
  Tensor t = arange(shape, placement, nd_sbp);
  int index = placement.IndexOf(CurrentRank());
  if (index < 0 || !nd_sbp.has_partial()) return t;
  std::vector<int64_t> coord = placement.Coord(index);
  int64_t m = 1, q = 0;
  for (int a = 0; a < nd_sbp.size(); ++a) {
    if (!nd_sbp[a].is_partial()) continue;
    m *= placement.hierarchy()[a];
    q = q * placement.hierarchy()[a] + coord[a];
  }
  Box box = LocalBox(shape, placement, nd_sbp, CurrentRank());
  Tensor local = t.to_local();
  float* data = local.data<float>();
  std::vector<int64_t> strides = shape.ContiguousStrides(), idx(shape.ndim(), 0);
  for (int64_t i = 0; i < box.numel(); ++i) {
    int64_t flat = 0;
    for (int64_t d = 0; d < shape.ndim(); ++d) flat += (box[d].begin + idx[d]) * strides[d];
    float k = static_cast<float>(flat % 7 + 1);
    data[i] += q == 0 ? -(m - 1) * k : k;
    for (int64_t d = shape.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < box[d].size()) break;
      idx[d] = 0;
    }
  }
  return t;
}

// The flat (row-major) indices of the elements of `box` in `shape`, in the
// box's own row-major order.
std::vector<int64_t> FlatIndices(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  out.reserve(box.numel());
  std::vector<int64_t> strides = shape.ContiguousStrides(), idx(shape.ndim(), 0);
  for (int64_t i = 0; i < box.numel(); ++i) {
    int64_t flat = 0;
    for (int64_t d = 0; d < shape.ndim(); ++d) flat += (box[d].begin + idx[d]) * strides[d];
    out.push_back(flat);
    for (int64_t d = shape.ndim() - 1; d >= 0; --d) {
      if (++idx[d] < box[d].size()) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Results are checked without boxing (which is what is under test):
//  - locally: every rank's shard of a non-partial result equals the slice of
//    the original that SliceOf gives its mesh coordinate, element by element;
//  - across ranks: every rank adds its shard at its box into a buffer of the
//    logical size, one segment per pair, and a single all-reduce at the end
//    sums the segments; each element must come to the original times the
//    number of copies the layout keeps (partial summands add up to one).
struct Tally {
  int64_t pairs = 0;
  int64_t failures = 0;
  std::vector<float> placed, expected;
  std::vector<std::string> names;  // per pair, for messages
  std::vector<int64_t> offsets;    // per pair: where its segment starts
};

void CheckPair(const Shape& shape, const Placement& src_p, const NdSbp& src, const Placement& dst_p,
               const NdSbp& dst, Tally* tally) {
  ++tally->pairs;
  Tensor x = MakeSource(shape, src_p, src);
  Tensor y = x.to_global(dst_p, dst);
  const int rank = CurrentRank();
  bool ok = y.placement() == dst_p && y.nd_sbp() == dst && y.shape() == shape;
  const int64_t offset = static_cast<int64_t>(tally->placed.size());
  tally->offsets.push_back(offset);
  std::ostringstream name;
  name << shape << " " << src << " on " << src_p << " -> " << dst << " on " << dst_p;
  tally->names.push_back(name.str());
  tally->placed.resize(offset + shape.numel(), 0.f);
  tally->expected.resize(offset + shape.numel(), 0.f);
  int64_t partial_group = 1;
  for (int a = 0; a < dst.size(); ++a)
    if (dst[a].is_partial()) partial_group *= dst_p.hierarchy()[a];
  // Expected sums: each element times the ranks holding it, over the ranks
  // that share one partial sum.
  for (int i = 0; i < dst_p.size(); ++i) {
    Box box = SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(i));
    for (int64_t flat : FlatIndices(shape, box))
      tally->expected[offset + flat] += static_cast<float>(flat) / static_cast<float>(partial_group);
  }
  if (dst_p.Contains(rank)) {
    Box box = SliceOf(shape, dst, dst_p.hierarchy(), dst_p.Coord(dst_p.IndexOf(rank)));
    Tensor local = y.to_local();
    ok = ok && local.shape() == box.shape();
    if (ok) {
      const float* v = local.data<float>();
      std::vector<int64_t> flats = FlatIndices(shape, box);
      for (size_t j = 0; j < flats.size(); ++j) {
        tally->placed[offset + flats[j]] += v[j];
        if (!dst.has_partial()) ok = ok && v[j] == static_cast<float>(flats[j]);
      }
    }
  }
  if (!ok) {
    ++tally->failures;
    if (tally->failures <= 5) {
      LOG(ERROR) << "rank " << rank << ": wrong shard after "
                 << GetBoxingPlan(src_p, src, dst_p, dst, shape, DType::kFloat32)->Explain();
    }
  }
}

// The cross-rank half of the check: one all-reduce for every pair.
void CheckSums(Tally* tally) {
  auto& world = comm::World();
  world.AllReduce(tally->placed.data(), static_cast<int64_t>(tally->placed.size()), DType::kFloat32,
                  comm::ReduceOp::kSum);
  for (size_t p = 0; p < tally->offsets.size(); ++p) {
    const int64_t begin = tally->offsets[p];
    const int64_t end = p + 1 < tally->offsets.size() ? tally->offsets[p + 1] : tally->placed.size();
    for (int64_t i = begin; i < end; ++i) {
      if (std::abs(tally->placed[i] - tally->expected[i]) > 1e-3f * (1 + std::abs(tally->expected[i]))) {
        ++tally->failures;
        if (tally->failures <= 5 && world.rank() == 0) {
          LOG(ERROR) << "element " << i - begin << " sums to " << tally->placed[i] << " over the ranks, "
                     << tally->expected[i] << " expected, after " << tally->names[p];
        }
        break;
      }
    }
  }
}

int Run() {
  auto& world = comm::World();
  std::vector<int> all(world.size());
  for (int r = 0; r < world.size(); ++r) all[r] = r;
  std::vector<Shape> shapes;
  std::stringstream ss(FLAGS_shapes);
  std::string item;
  while (std::getline(ss, item, ';')) shapes.push_back(Shape(ParseList(item)));

  Tally tally;
  if (FLAGS_suite == "mesh") {
    Placement mesh(DeviceType::kCPU, all, ParseList(FLAGS_mesh));
    for (const Shape& shape : shapes) {
      std::vector<NdSbp> layouts = AllNdSbps(mesh.ndim(), shape.ndim());
      for (const NdSbp& src : layouts)
        for (const NdSbp& dst : layouts) CheckPair(shape, mesh, src, mesh, dst, &tally);
    }
  } else {
    TESSEL_CHECK(world.size() == 6) << "--suite=cross needs 6 ranks, got " << world.size();
    struct Case {
      const char* name;
      Placement src, dst;
    };
    const std::vector<Case> cases = {
        {"4 ranks -> 2 other ranks", Placement("cpu", {0, 1, 2, 3}), Placement("cpu", {4, 5})},
        {"2 ranks -> 4 other ranks", Placement("cpu", {4, 5}), Placement("cpu", {0, 1, 2, 3})},
        {"[2,2] -> [4] on the same ranks", Placement("cpu", {{0, 1}, {2, 3}}),
         Placement("cpu", {0, 1, 2, 3})},
        {"[2,2] -> [2] partly overlapping", Placement("cpu", {{0, 1}, {2, 3}}), Placement("cpu", {3, 4})},
        {"[2,3] -> [3,2] on the same ranks", Placement::Parse("cpu:[[0,1,2],[3,4,5]]"),
         Placement::Parse("cpu:[[0,1],[2,3],[4,5]]")},
        {"1 -> N", Placement("cpu", {5}), Placement("cpu", {0, 1, 2, 3})},
        {"N -> 1", Placement("cpu", {0, 1, 2, 3}), Placement("cpu", {5})},
    };
    for (const Case& c : cases) {
      int64_t before = tally.pairs;
      for (const Shape& shape : shapes)
        for (const NdSbp& src : AllNdSbps(c.src.ndim(), shape.ndim()))
          for (const NdSbp& dst : AllNdSbps(c.dst.ndim(), shape.ndim()))
            CheckPair(shape, c.src, src, c.dst, dst, &tally);
      if (world.rank() == 0) LOG(INFO) << c.name << ": " << tally.pairs - before << " pairs";
    }
  }
  CheckSums(&tally);
  int64_t failures = tally.failures;
  world.AllReduce(&failures, 1, DType::kInt64, comm::ReduceOp::kSum);
  if (world.rank() == 0) {
    std::printf(
        "boxing %s suite (mesh %s, shapes %s): %lld source/destination pairs tested, %lld rank-level "
        "failures\n",
        FLAGS_suite.c_str(), FLAGS_suite == "mesh" ? FLAGS_mesh.c_str() : "-", FLAGS_shapes.c_str(),
        static_cast<long long>(tally.pairs), static_cast<long long>(failures));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tessel

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  return tessel::Run();
}
