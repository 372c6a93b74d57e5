#include "sbp/slice.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tessel
