#include "sbp/boxing_plan.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::AllNdSbps;

const Placement kLine("cpu", {0, 1, 2, 3});
const Shape kEven{8, 16};  // 128 f32 = 512 bytes, divisible by 4 and 16
constexpr double T = 512;
constexpr double p = 4;

BoxingPlan Plan1D(const Sbp& from, const Sbp& to) {
  return PlanBoxing(kLine, NdSbp{from}, kLine, NdSbp{to}, kEven, DType::kFloat32);
}

void ExpectSingleStep(const Sbp& from, const Sbp& to, BoxingOp op, double bytes) {
  BoxingPlan plan = Plan1D(from, to);
  ASSERT_EQ(plan.steps.size(), 1u) << plan.Explain();
  EXPECT_EQ(plan.steps[0].op, op) << plan.Explain();
  EXPECT_DOUBLE_EQ(plan.bytes_per_rank(), bytes) << plan.Explain();
}

// The cost formulas of DESIGN.md (T bytes, p ranks).
TEST(BoxingPlan, OneDimensionalCostsMatchTheRingFormulas) {
  ExpectSingleStep(P(), B(), BoxingOp::kAllReduce, 2 * T * (p - 1) / p);
  ExpectSingleStep(P(), S(0), BoxingOp::kReduceScatter, T * (p - 1) / p);
  ExpectSingleStep(P(), S(1), BoxingOp::kReduceScatter, T * (p - 1) / p);
  ExpectSingleStep(S(0), B(), BoxingOp::kAllGather, T * (p - 1) / p);
  ExpectSingleStep(S(1), B(), BoxingOp::kAllGather, T * (p - 1) / p);
  ExpectSingleStep(S(0), S(1), BoxingOp::kAllToAll, T * (p - 1) / (p * p));
  ExpectSingleStep(S(1), S(0), BoxingOp::kAllToAll, T * (p - 1) / (p * p));
  ExpectSingleStep(B(), S(0), BoxingOp::kLocalSlice, 0);
  ExpectSingleStep(B(), P(), BoxingOp::kZeroFill, 0);
  ExpectSingleStep(S(0), P(), BoxingOp::kZeroPad, 0);
  ExpectSingleStep(PMax(), B(), BoxingOp::kAllReduce, 2 * T * (p - 1) / p);
  EXPECT_TRUE(Plan1D(S(0), S(0)).steps.empty());
  EXPECT_TRUE(Plan1D(P(), P()).steps.empty());
}

TEST(BoxingPlan, ExplainSaysWhatAndHowMuch) {
  std::string text = Plan1D(P(), B()).Explain();
  EXPECT_NE(text.find("all-reduce (sum) along mesh axis 0: [P] -> [B]"), std::string::npos) << text;
  EXPECT_NE(text.find("768 bytes sent per rank"), std::string::npos) << text;
}

TEST(BoxingPlan, CyclicTwoDimensionalCaseIsFound) {
  Placement mesh("cpu", {{0, 1}, {2, 3}});
  BoxingPlan plan = PlanBoxing(mesh, {S(0), S(1)}, mesh, {S(1), S(0)}, Shape{8, 8}, DType::kFloat32);
  ASSERT_FALSE(plan.steps.empty());
  EXPECT_EQ(plan.steps.front().from, (NdSbp{S(0), S(1)}));
  EXPECT_EQ(plan.steps.back().to, (NdSbp{S(1), S(0)}));
  for (size_t i = 1; i < plan.steps.size(); ++i) EXPECT_EQ(plan.steps[i].from, plan.steps[i - 1].to);
  // Never more than gathering everything and slicing again.
  EXPECT_LE(plan.bytes_per_rank(), 256.0 * 3 / 4) << plan.Explain();
}

// Where one primitive does the whole conversion, the chosen plan moves no
// more bytes than it; and every plan is a chain from source to target.
TEST(BoxingPlan, NeverWorseThanTheBestSingleStep) {
  const Shape shape{7, 5, 3};
  int pairs = 0, single = 0;
  for (const Placement& mesh : {Placement("cpu", {0, 1, 2, 3}), Placement("cpu", {{0, 1}, {2, 3}}),
                                Placement(DeviceType::kCPU, {0, 1, 2, 3, 4, 5}, {2, 3}),
                                Placement(DeviceType::kCPU, {0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2})}) {
    for (const NdSbp& src : AllNdSbps(mesh.ndim(), 3)) {
      for (const NdSbp& dst : AllNdSbps(mesh.ndim(), 3)) {
        BoxingPlan plan = PlanBoxing(mesh, src, mesh, dst, shape, DType::kFloat32);
        ++pairs;
        NdSbp at = src;
        for (const BoxingStep& s : plan.steps) {
          ASSERT_EQ(s.from, at);
          at = s.to;
        }
        ASSERT_EQ(at, dst);
        int differ = -1, count = 0;
        for (int a = 0; a < mesh.ndim(); ++a)
          if (src[a] != dst[a]) differ = a, ++count;
        BoxingStep direct;
        if (count == 1 && AxisStep(mesh, src, differ, dst[differ], shape, DType::kFloat32, {}, &direct)) {
          ++single;
          ASSERT_LE(plan.bytes_per_rank(), direct.bytes_per_rank + 1e-9)
              << plan.Explain() << "\nvs direct: " << direct.Describe();
        }
      }
    }
  }
  std::cout << "planned " << pairs << " same-placement pairs; " << single << " had a single-step route\n";
  EXPECT_EQ(pairs, 25 + 625 + 625 + 15625);
}

TEST(BoxingPlan, CrossPlacementUsesSliceTransfers) {
  // The pipeline hop: same layout, disjoint ranks: each rank sends its shard.
  Placement a("cpu", {0, 1}), b("cpu", {2, 3});
  BoxingPlan hop = PlanBoxing(a, {S(0)}, b, {S(0)}, kEven, DType::kFloat32);
  ASSERT_EQ(hop.steps.size(), 1u) << hop.Explain();
  EXPECT_EQ(hop.steps[0].op, BoxingOp::kSliceTransfer);
  EXPECT_DOUBLE_EQ(hop.bytes_per_rank(), T / 2);
  // A partial source is reduced on its own ranks before it moves.
  BoxingPlan partial = PlanBoxing(a, {P()}, b, {B()}, kEven, DType::kFloat32);
  EXPECT_NE(partial.steps.front().op, BoxingOp::kSliceTransfer) << partial.Explain();
  // N -> 1 and 1 -> N.
  Placement one("cpu", {3});
  EXPECT_FALSE(PlanBoxing(kLine, {S(1)}, one, {B()}, kEven, DType::kFloat32).steps.empty());
  EXPECT_FALSE(PlanBoxing(one, {B()}, kLine, {P()}, kEven, DType::kFloat32).steps.empty());
}

// Gathering the outer of two nested splits of one dimension: rank (a, c)
// holds quarter 2a + c and needs half c, so each rank's part belongs to
// ranks of another row and no collective along one axis does it. One slice
// transfer does: quarter 2a + c goes to the ranks (x, a) that lack it, at
// most two of them, T/2 from the busiest rank. Collectives alone gather
// along c (T/4 per rank), then along a (T/2), and slice: 3T/4. A
// conversion that changes only the inner split stays a collective.
TEST(BoxingPlan, GatheringAnOuterNestedSplitIsOneSliceTransfer) {
  Placement mesh("cpu", {{0, 1}, {2, 3}});
  BoxingPlan outer = PlanBoxing(mesh, {S(0), S(0)}, mesh, {B(), S(0)}, kEven, DType::kFloat32);
  ASSERT_EQ(outer.steps.size(), 1u) << outer.Explain();
  EXPECT_EQ(outer.steps[0].op, BoxingOp::kSliceTransfer) << outer.Explain();
  EXPECT_DOUBLE_EQ(outer.bytes_per_rank(), T / 2) << outer.Explain();
  BoxingPlan inner = PlanBoxing(mesh, {S(0), S(0)}, mesh, {S(0), B()}, kEven, DType::kFloat32);
  ASSERT_EQ(inner.steps.size(), 1u) << inner.Explain();
  EXPECT_EQ(inner.steps[0].op, BoxingOp::kAllGather) << inner.Explain();
}

TEST(BoxingPlan, BadInputIsNamed) {
  try {
    PlanBoxing(kLine, {S(2)}, kLine, {B()}, kEven, DType::kFloat32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NdSbp [S(2)] splits axis 2 but the tensor has 2 dimension(s)"),
              std::string::npos);
  }
  EXPECT_THROW(PlanBoxing(kLine, {S(0), B()}, kLine, {B()}, kEven, DType::kFloat32), Error);
}

}  // namespace
}  // namespace tessel
