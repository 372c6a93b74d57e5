#include "sbp/slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "sbp/slice_transfer.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

TEST(Slice, BalancedSplitLargerFirst) {
  std::vector<Range> parts = BalancedSplit(7, 3);
  EXPECT_EQ(parts, (std::vector<Range>{{0, 3}, {3, 5}, {5, 7}}));
  parts = BalancedSplit(2, 4);  // fewer elements than parts
  EXPECT_EQ(parts, (std::vector<Range>{{0, 1}, {1, 2}, {2, 2}, {2, 2}}));
  EXPECT_EQ(BalancedPart({10, 17}, 2, 1), (Range{14, 17}));
}

TEST(Slice, NestedSplitsCutOutermostFirst) {
  Shape shape{7, 5, 3};
  // [S(0), S(0)] on 2x2: dim 0 -> [0,4) [4,7), then each in two.
  EXPECT_EQ(SliceOf(shape, {S(0), S(0)}, {2, 2}, {0, 1}).ToString(), "[2:4, 0:5, 0:3]");
  EXPECT_EQ(SliceOf(shape, {S(0), S(0)}, {2, 2}, {1, 1}).ToString(), "[6:7, 0:5, 0:3]");
  // B and P keep the full range.
  EXPECT_EQ(SliceOf(shape, {P(), S(2)}, {2, 3}, {1, 2}).ToString(), "[0:7, 0:5, 2:3]");
  Box a({{0, 4}, {1, 3}}), b({{2, 7}, {0, 2}});
  EXPECT_EQ(a.Intersect(b).ToString(), "[2:4, 1:2]");
  EXPECT_TRUE(a.Intersect(Box({{5, 6}, {0, 9}})).empty());
}

TEST(Slice, TransfersCoverEveryDestinationExactly) {
  Shape shape{7, 5};
  Placement src("cpu", {{0, 1}, {2, 3}}), dst("cpu", {4, 5, 6});
  auto transfers = PlanSliceTransfers(src, {S(1), B()}, dst, {S(0)}, shape);
  std::map<int, int64_t> received;
  for (const auto& t : transfers) {
    EXPECT_TRUE(src.Contains(t.src_rank));
    received[t.dst_rank] += t.box.numel();
  }
  EXPECT_EQ(received, (std::map<int, int64_t>{{4, 15}, {5, 10}, {6, 10}}));
  // Replicas share the sending: both copies of each column block are used.
  std::set<int> senders;
  for (const auto& t : transfers) senders.insert(t.src_rank);
  EXPECT_EQ(senders.size(), 4u);
}

// The busiest sender's load, counted without listing the transfers, is
// what the listed transfers add up to: same, overlapping and disjoint
// placements, splits that cross, nested splits, replicas, uneven and empty
// parts.
TEST(Slice, CountedLoadIsTheListedTransfersLoad) {
  struct Case {
    Placement src, dst;
    NdSbp x, y;
    Shape shape;
  };
  const Placement grid("cpu", {{0, 1, 2}, {3, 4, 5}}), line("cpu", {6, 7, 8, 9}), overlap("cpu", {4, 5, 6, 7});
  const std::vector<Case> cases = {
      {grid, grid, {S(0), S(1)}, {S(1), S(0)}, Shape{7, 11}},
      {grid, grid, {B(), S(1)}, {S(0), B()}, Shape{6, 5}},
      {grid, line, {S(1), S(0)}, {S(0)}, Shape{9, 4}},
      {grid, line, {S(0), S(0)}, {S(1)}, Shape{13, 3, 2}},
      {line, grid, {B()}, {S(2), S(1)}, Shape{2, 5, 3}},
      {grid, overlap, {S(1), B()}, {S(0)}, Shape{3, 8}},
      {line, overlap, {S(0)}, {S(0)}, Shape{2, 2}},  // parts of zero rows
      {grid, line, {B(), B()}, {B()}, Shape{}},      // a scalar
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.src.ToString() + " " + c.x.ToString() + " -> " + c.dst.ToString() + " " + c.y.ToString() +
                 " of " + c.shape.ToString());
    std::map<int, int64_t> elements, messages;
    for (const SliceTransfer& t : PlanSliceTransfers(c.src, c.x, c.dst, c.y, c.shape)) {
      if (t.src_rank == t.dst_rank) continue;
      elements[t.src_rank] += t.box.numel();
      ++messages[t.src_rank];
    }
    SliceTransferLoad want;
    for (const auto& [rank, n] : elements) want.elements = std::max(want.elements, n);
    for (const auto& [rank, n] : messages) want.messages = std::max(want.messages, n);
    const SliceTransferLoad got = CountSliceTransferLoad(c.src, c.x, c.dst, c.y, c.shape);
    EXPECT_EQ(got.elements, want.elements);
    EXPECT_EQ(got.messages, want.messages);
    EXPECT_GT(want.messages, 0);  // (every case moves something)
  }
}

}  // namespace
}  // namespace tessel
