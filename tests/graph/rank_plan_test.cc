// Per-rank physical plans on a two-stage graph: each rank's plan holds only
// the ops it takes part in, with its shard shapes and the sends, receives
// and collectives it makes; the bytes are the same on every compile.
#include "graph/plan/rank_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/plan/rank_plan.pb.h"
#include "tests/graph/small_graph.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

// Stage 0 on ranks 0, 1 computes h = x w [S(0)]; h moves to stage 1 on
// ranks 2, 3 ([S(0)] there), which computes tanh and gathers the result.
testing::SmallGraph TwoStages() {
  const Placement stage0("cpu", std::vector<int>{0, 1}), stage1("cpu", std::vector<int>{2, 3});
  testing::SmallGraph g("two_stages", stage0);
  const NdSbp s0({S(0)}), b({B()});
  const int x = g.Input("x", {16, 8}, s0);
  const int w = g.Input("w", {8, 8}, b);
  const int h = g.Op("matmul", {x, w}, {s0, b}, {16, 8}, s0);
  const int moved = g.ToGlobal(h, s0, &stage1);
  const int y = g.Op("tanh", {moved}, {s0}, {16, 8}, s0);
  g.graph.MarkOutput("y", g.ToGlobal(y, b));
  return g;
}

std::vector<std::string> OpNames(const proto::RankPlanProto& plan) {
  std::vector<std::string> names;
  for (const proto::PlanOpProto& op : plan.ops()) names.push_back(op.name());
  return names;
}

TEST(RankPlan, HoldsOnlyTheRanksOwnOpsAndWhatItCommunicates) {
  const testing::SmallGraph g = TwoStages();
  proto::RankPlanProto r0, r2, outside;
  CompileRankPlan(g.graph, 0, &r0);
  CompileRankPlan(g.graph, 2, &r2);
  CompileRankPlan(g.graph, 5, &outside);

  EXPECT_EQ(OpNames(r0), (std::vector<std::string>{"matmul", "to_global"}));
  ASSERT_EQ(r0.ops(1).comms_size(), 1);
  const proto::CommProto& send = r0.ops(1).comms(0);
  EXPECT_EQ(send.kind(), "send");
  EXPECT_EQ(send.ranks(0), 2);  // rows 0..7 go to the rank holding them on stage 1
  EXPECT_EQ(send.elements(), 8 * 8);
  EXPECT_EQ(send.bytes(), 8 * 8 * 4);
  // Shard shapes: h is [16, 8] split over two ranks.
  bool found = false;
  for (const proto::PlanValueProto& v : r0.values()) {
    if (v.id() != g.graph.ops()[0].outputs[0]) continue;
    found = true;
    EXPECT_EQ(std::vector<int64_t>(v.local_shape().begin(), v.local_shape().end()),
              (std::vector<int64_t>{8, 8}));
  }
  EXPECT_TRUE(found);

  EXPECT_EQ(OpNames(r2), (std::vector<std::string>{"to_global", "tanh", "to_global"}));
  ASSERT_EQ(r2.ops(0).comms_size(), 1);
  EXPECT_EQ(r2.ops(0).comms(0).kind(), "recv");
  EXPECT_EQ(r2.ops(0).comms(0).ranks(0), 0);
  ASSERT_EQ(r2.ops(2).comms_size(), 1);
  const proto::CommProto& gather = r2.ops(2).comms(0);
  EXPECT_EQ(gather.kind(), "all-gather");
  EXPECT_EQ(std::vector<int>(gather.ranks().begin(), gather.ranks().end()), (std::vector<int>{2, 3}));
  EXPECT_EQ(gather.elements(), 16 * 8);
  ASSERT_EQ(r2.comm_summary_size(), 2);
  EXPECT_EQ(r2.comm_summary(0).kind(), "all-gather");
  EXPECT_EQ(r2.comm_summary(0).bytes(), 16 * 8 * 4);
  EXPECT_EQ(r2.comm_summary(1).kind(), "recv");
  EXPECT_EQ(r2.comm_summary(1).bytes(), 8 * 8 * 4);

  EXPECT_EQ(outside.ops_size(), 0);
  const std::string text = RankPlanText(r2);
  EXPECT_NE(text.find("[recv 64 f32 from 0]"), std::string::npos) << text;
  EXPECT_NE(text.find("all-gather: 1 ops, 512 bytes"), std::string::npos) << text;

  // Memory (graph/passes/memory_planning.h): rank 0 holds its 256-byte
  // shard of h (one 512-byte block); rank 2 holds the received shard and
  // tanh's result at once, then tanh's result and the gathered copy.
  EXPECT_EQ(r0.memory().peak_bytes(), 512);
  EXPECT_EQ(r2.memory().peak_bytes(), 1024);
  EXPECT_EQ(r2.memory().peak_op(), 2);
  EXPECT_EQ(outside.memory().peak_bytes(), 0);
  EXPECT_NE(text.find("memory: peak 1.0 KiB of op results (at op 2 'tanh')"), std::string::npos) << text;
}

TEST(RankPlan, CompilesToTheSameBytesEveryTime) {
  const testing::SmallGraph g = TwoStages();
  for (int rank = 0; rank < 4; ++rank) {
    std::string first;
    for (int i = 0; i < 3; ++i) {
      proto::RankPlanProto plan;
      CompileRankPlan(TwoStages().graph, rank, &plan);
      std::string bytes;
      ASSERT_TRUE(plan.SerializeToString(&bytes));
      if (i == 0) first = bytes;
      EXPECT_EQ(bytes, first) << "rank " << rank << " compile " << i;
    }
  }
}

}  // namespace
}  // namespace tessel
