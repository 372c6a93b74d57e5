// Stage assignment on small graphs of two pipeline stages, ranks {0, 1} and
// {2, 3}: ops get their stage, crossings become send / recv pairs (with the
// layout changes each side needs), and misplaced ops are named.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "graph/passes/passes.h"
#include "graph/plan/rank_plan.h"
#include "graph/plan/rank_plan.pb.h"
#include "tests/graph/small_graph.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::SmallGraph;

const Placement kStage0("cpu", std::vector<int>{0, 1}), kStage1("cpu", std::vector<int>{2, 3});
const std::vector<std::vector<int>> kStageRanks = {{0, 1}, {2, 3}};
const NdSbp kS0({S(0)}), kB({B()}), kP({P()});

// Tags the op producing `value` with model layer `layer`.
void SetLayer(ir::Graph& graph, int value, int64_t layer) {
  std::vector<ir::Op> ops = graph.ops();
  ops[static_cast<size_t>(graph.value(value).producer)].layer = layer;
  graph.SetOps(std::move(ops));
}

// What `fn` throws, or "no error".
template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

std::vector<std::string> Names(const ir::Graph& graph) {
  std::vector<std::string> names;
  for (const ir::Op& op : graph.ops()) names.push_back(op.name);
  return names;
}

// Layer 0 on stage 0 computes `layout` of an [8, 4] activation; layer 1 on
// stage 1 reads it as `wanted`.
struct TwoStages {
  SmallGraph g{"pipeline", kStage0};
  int x, y, moved, z;
  TwoStages(const NdSbp& layout, const NdSbp& wanted) {
    x = g.Input("x", {8, 4}, kS0);
    y = g.Op("neg", {x}, {kS0}, {8, 4}, layout);
    moved = g.ToGlobal(y, wanted, &kStage1);
    z = g.Op("tanh", {moved}, {wanted}, {8, 4}, wanted);
    g.graph.MarkOutput("z", z);
    SetLayer(g.graph, y, 0);
    SetLayer(g.graph, z, 1);
  }
};

TEST(StageAssignment, ACrossingBecomesASendOnOneStageAndARecvOnTheOther) {
  TwoStages t(kS0, kB);
  passes::AssignStages(t.g.graph, kStageRanks, {0, 1});
  ir::Verify(t.g.graph, true);
  EXPECT_EQ(Names(t.g.graph), (std::vector<std::string>{"neg", "send", "recv", "tanh"}));
  const std::vector<ir::Op>& ops = t.g.graph.ops();
  EXPECT_EQ(ops[0].stage, 0);
  EXPECT_EQ(ops[1].stage, 0);
  EXPECT_EQ(ops[2].stage, 1);
  EXPECT_EQ(ops[3].stage, 1);
  // The send reads the activation; the recv gives the same value id the
  // reader already reads, laid out on stage 1.
  EXPECT_EQ(ops[1].inputs, std::vector<int>{t.y});
  EXPECT_TRUE(ops[1].outputs.empty());
  EXPECT_EQ(ops[2].outputs, std::vector<int>{t.moved});
  EXPECT_EQ(t.g.graph.value(t.moved).placement, kStage1);
  // Each rank's plan holds its own half: rank 0 sends its 4 rows to both
  // of stage 1's ranks (B there), rank 3 receives 4 rows from each of
  // stage 0's.
  proto::RankPlanProto plan0, plan3;
  CompileRankPlan(t.g.graph, 0, &plan0);
  CompileRankPlan(t.g.graph, 3, &plan3);
  std::vector<std::string> names0, names3;
  for (const auto& op : plan0.ops()) names0.push_back(op.name());
  for (const auto& op : plan3.ops()) names3.push_back(op.name());
  EXPECT_EQ(names0, (std::vector<std::string>{"neg", "send"}));
  EXPECT_EQ(names3, (std::vector<std::string>{"recv", "tanh"}));
  ASSERT_EQ(plan0.ops(1).comms_size(), 2);
  for (const auto& c : plan0.ops(1).comms()) {
    EXPECT_EQ(c.kind(), "send");
    EXPECT_EQ(c.elements(), 16);
  }
  ASSERT_EQ(plan3.ops(0).comms_size(), 2);
  EXPECT_EQ(plan3.ops(0).comms(0).kind(), "recv");
  EXPECT_EQ(plan3.ops(0).comms(0).ranks(0), 0);
  EXPECT_EQ(plan3.ops(0).comms(1).ranks(0), 1);
}

TEST(StageAssignment, APartialSumIsReducedOnItsOwnStageBeforeItIsSent) {
  // A partial sum cannot travel in slices: stage 0 all-reduces it first.
  TwoStages t(kP, kB);
  passes::AssignStages(t.g.graph, kStageRanks, {0, 1});
  ir::Verify(t.g.graph, true);
  EXPECT_EQ(Names(t.g.graph), (std::vector<std::string>{"neg", "to_global", "send", "recv", "tanh"}));
  const ir::Op& reduce = t.g.graph.ops()[1];
  EXPECT_EQ(reduce.stage, 0);
  EXPECT_EQ(t.g.graph.value(reduce.outputs[0]).placement, kStage0);
  // Reduce-scattered (the boxing planner's cheapest), not all-reduced.
  EXPECT_EQ(t.g.graph.value(reduce.outputs[0]).nd_sbp, kS0) << t.g.graph.ToText();
  EXPECT_EQ(t.g.graph.ops()[2].inputs, reduce.outputs);
}

TEST(StageAssignment, WithoutStagesNothingChanges) {
  TwoStages t(kS0, kB);
  const std::string before = t.g.graph.ToText();
  passes::AssignStages(t.g.graph, {}, {});
  EXPECT_EQ(t.g.graph.ToText(), before);
}

TEST(StageAssignment, MisplacedOpsAreNamed) {
  // Layer 1's op computes on stage 0's ranks.
  {
    TwoStages t(kS0, kB);
    SetLayer(t.g.graph, t.y, 1);
    const std::string m = ErrorOf([&] { passes::AssignStages(t.g.graph, kStageRanks, {0, 1}); });
    EXPECT_NE(
        m.find("op 0 'neg' of layer 1 computes on stage 0 (ranks {0, 1}), which is not its stage: layer 1 "
               "belongs to stage 1 (ranks {2, 3})"),
        std::string::npos)
        << m;
  }
  // A layer beyond the stages' layers.
  {
    TwoStages t(kS0, kB);
    SetLayer(t.g.graph, t.z, 5);
    const std::string m = ErrorOf([&] { passes::AssignStages(t.g.graph, kStageRanks, {0, 1}); });
    EXPECT_NE(
        m.find(
            "'tanh' belongs to layer_idx 5, beyond the pipeline's layers: stages are given for layers 0..1"),
        std::string::npos)
        << m;
  }
  // An op on ranks of both stages.
  {
    const Placement across("cpu", std::vector<int>{1, 2});
    SmallGraph g("across", across);
    const int x = g.Input("x", {4}, kB);
    g.graph.MarkOutput("y", g.Op("neg", {x}, {kB}, {4}, kB));
    const std::string m = ErrorOf([&] { passes::AssignStages(g.graph, kStageRanks, {}); });
    EXPECT_NE(
        m.find("op 0 'neg' uses %1 on cpu:[1, 2], which is on no single pipeline stage: its ranks lie in "
               "stage 0: {1}; in stage 1: {2};"),
        std::string::npos)
        << m;
  }
  // Stages that share a rank.
  EXPECT_NE(ErrorOf([&] {
              TwoStages t(kS0, kB);
              passes::AssignStages(t.g.graph, {{0, 1}, {1, 2}}, {});
            }).find("pipeline stages 0 and 1 both hold rank 1"),
            std::string::npos);
}

TEST(StageAssignment, PipelineConfigsThatLoseOrReverseLayersAreRefused) {
  // A stage given no layers.
  {
    TwoStages t(kS0, kB);
    const std::string m = ErrorOf([&] { passes::AssignStages(t.g.graph, kStageRanks, {0, 0}); });
    EXPECT_NE(m.find("pipeline stage 1 (ranks {2, 3}) is given none of the 2 layers"), std::string::npos)
        << m;
  }
  // Stages given for three layers; the model built two.
  {
    TwoStages t(kS0, kB);
    const std::string m = ErrorOf([&] { passes::AssignStages(t.g.graph, kStageRanks, {0, 1, 1}); });
    EXPECT_NE(m.find("stages are given for 3 layers but layer(s) {2} recorded no ops"), std::string::npos)
        << m;
  }
  // Layer 0 on stage 1 feeds layer 1 on stage 0: the forward flows back.
  {
    SmallGraph g("backwards", kStage1);
    const int x = g.Input("x", {8, 4}, kS0);
    const int y = g.Op("neg", {x}, {kS0}, {8, 4}, kS0);
    const int moved = g.ToGlobal(y, kB, &kStage0);
    const int z = g.Op("tanh", {moved}, {kB}, {8, 4}, kB);
    g.graph.MarkOutput("z", z);
    SetLayer(g.graph, y, 0);
    SetLayer(g.graph, moved, 1);
    SetLayer(g.graph, z, 1);
    const std::string m = ErrorOf([&] { passes::AssignStages(g.graph, kStageRanks, {1, 0}); });
    EXPECT_NE(m.find("op 1 moves %1 (f32 [8, 4] [S(0)] on cpu:[2, 3]) from stage 1 back to stage 0 in the "
                     "forward pass (read by layer 1)"),
              std::string::npos)
        << m;
  }
  // The same move in the backward pass (a gradient) is the pipeline's flow.
  {
    SmallGraph g("gradient", kStage1);
    const int x = g.Input("x", {8, 4}, kS0);
    const int y = g.Op("neg", {x}, {kS0}, {8, 4}, kS0);
    const int moved = g.ToGlobal(y, kB, &kStage0);
    g.graph.MarkOutput("z", g.Op("tanh", {moved}, {kB}, {8, 4}, kB));
    std::vector<ir::Op> ops = g.graph.ops();
    for (ir::Op& op : ops) op.backward = true;
    g.graph.SetOps(std::move(ops));
    EXPECT_EQ(ErrorOf([&] { passes::AssignStages(g.graph, kStageRanks, {}); }), "no error");
  }
}

// Four layers on two stages of two chunks (virtual stages 0..3 on ranks
// {0, 1}, {2, 3}, {0, 1}, {2, 3}): each op gets its layer's virtual
// stage, an op of no layer the latest it reads from on its ranks, and
// each transfer goes to the next virtual stage on the receiving ranks
// (forward) or the one before (backward), under a tag of its own.
TEST(StageAssignment, InterleavedLayersGetVirtualStages) {
  SmallGraph g("interleaved", kStage0);
  const int x = g.Input("x", {8, 4}, kB);
  const int embedded = g.Op("neg", {x}, {kB}, {8, 4}, kB);  // no layer, stage 0's ranks
  int h = embedded;
  std::vector<int> layer_outputs;
  for (int layer = 0; layer < 4; ++layer) {
    if (layer > 0) h = g.ToGlobal(h, kB, layer % 2 ? &kStage1 : &kStage0);
    h = g.Op("tanh", {h}, {kB}, {8, 4}, kB);
    SetLayer(g.graph, h, layer);
    layer_outputs.push_back(h);
  }
  const int head = g.Op("sigmoid", {h}, {kB}, {8, 4}, kB);  // no layer, after layer 3 on stage 1's ranks
  // A gradient from the head back to stage 0's ranks.
  const int gradient = g.ToGlobal(head, kB, &kStage0);
  const int summed = g.Op("add", {gradient, embedded}, {kB, kB}, {8, 4}, kB);
  g.graph.MarkOutput("summed", summed);
  std::vector<ir::Op> ops = g.graph.ops();
  ops[static_cast<size_t>(g.graph.value(gradient).producer)].backward = true;
  ops[static_cast<size_t>(g.graph.value(summed).producer)].backward = true;
  g.graph.SetOps(std::move(ops));

  passes::AssignStages(g.graph, kStageRanks, {0, 1, 2, 3});
  ir::Verify(g.graph, true);
  std::vector<std::string> placed;
  std::set<int64_t> tags;
  for (const ir::Op& op : g.graph.ops()) {
    placed.push_back(op.name + "@" + std::to_string(op.stage));
    if (op.name == "send") tags.insert(op.attrs.Get<int64_t>("tag"));
  }
  EXPECT_EQ(placed, (std::vector<std::string>{"neg@0", "tanh@0", "send@0", "recv@1", "tanh@1", "send@1",
                                              "recv@2", "tanh@2", "send@2", "recv@3", "tanh@3", "sigmoid@3",
                                              "send@3", "recv@2", "add@2"}))
      << g.graph.ToText();
  EXPECT_EQ(tags, (std::set<int64_t>{0, 1, 2, 3}));

  // Virtual stages must come in whole chunks per stage, each with a layer.
  SmallGraph three("three", kStage0);
  three.graph.MarkOutput("y", three.Op("neg", {three.Input("x", {4}, kB)}, {kB}, {4}, kB));
  const std::string m = ErrorOf([&] { passes::AssignStages(three.graph, kStageRanks, {0, 1, 2}); });
  EXPECT_NE(
      m.find("the layers' stages {0, 1, 2} name 3 virtual stages over 2 stages; expected a multiple of 2"),
      std::string::npos)
      << m;
  const std::string empty = ErrorOf([&] { passes::AssignStages(three.graph, kStageRanks, {0, 1, 3, 3}); });
  EXPECT_NE(empty.find("pipeline virtual stage 2 (stage 0) (ranks {0, 1}) is given none of the 4 layers"),
            std::string::npos)
      << empty;
}

TEST(StageAssignment, ATransferWhoseSidesDisagreeOnTheSpecFailsVerification) {
  TwoStages t(kS0, kB);
  passes::AssignStages(t.g.graph, kStageRanks, {0, 1});
  // Stage 1 expects [8, 5] where stage 0 sends [8, 4].
  std::vector<ir::Op> ops = t.g.graph.ops();
  ir::Value wider = t.g.graph.value(t.moved);
  wider.shape = Shape({8, 5});
  const int received = t.g.graph.NewValue(wider);
  ops[2].outputs = {received};
  ops[3].inputs = {received};
  t.g.graph.SetOps(std::move(ops));
  try {
    ir::Verify(t.g.graph, true);
    ADD_FAILURE() << "verified";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "op 2 'recv' moves %1 (f32 [8, 4] [S(0)] on cpu:[0, 1]) to %" + std::to_string(received) +
                  " (f32 [8, 5] [B] on cpu:[2, 3]); expected the same shape and dtype"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel
