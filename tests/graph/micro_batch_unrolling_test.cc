// Unrolling micro-batch units (graph/passes/micro_batch_unrolling.cc) on
// small graphs: the units are copied once per micro-batch with their
// micro-batch's index, sums run as each copy ends, the step's ops keep
// their side of the units, each rank copies only its own stage's units
// with transfer tags both sides agree on, and what cannot be unrolled is
// named.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/passes/passes.h"
#include "tests/graph/small_graph.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::SmallGraph;

const NdSbp kB({B()});

std::vector<std::string> Names(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Op& op : g.ops())
    names.push_back(op.name + (op.micro_batch >= 0 ? std::to_string(op.micro_batch) : std::string()));
  return names;
}

// Units written out by hand: x cut into micro-batches, negated (summed over
// them, then read by one more unit), a step op among the units that reads
// only the input, and the average after them.
struct HandUnits {
  SmallGraph g{"units", Placement("cpu", std::vector<int>{0})};
  int x = 0, share = 0, sum = 0, average = 0;
  explicit HandUnits(bool step_reads_a_unit = false) {
    x = g.Input("x", {4, 4}, kB);
    const int mb = g.Op("micro_batch", {x}, {kB}, {2, 4}, kB,
                        {{"index", int64_t{0}}, {"count", int64_t{2}}, {"blocks", int64_t{1}}});
    share = g.Op("neg", {mb}, {kB}, {2, 4}, kB);
    g.Op("exp", {step_reads_a_unit ? share : x}, {kB}, {step_reads_a_unit ? Shape({2, 4}) : Shape({4, 4})},
         kB);
    sum = g.Op("micro_batch_sum", {share}, {kB}, {2, 4}, kB, {{"count", int64_t{2}}});
    g.Op("tanh", {share}, {kB}, {2, 4}, kB);
    average = g.Op("mul_scalar", {sum}, {kB}, {2, 4}, kB, {{"scalar", 0.5}});
    g.graph.MarkOutput("average", average);
    for (int op : {0, 1, 3, 4}) g.graph.mutable_op(op).micro_batch = 0;
    g.graph.set_micro_batch_units(2);
  }
};

TEST(MicroBatchUnrolling, CopiesTheUnitsPerMicroBatchWithRunningSums) {
  HandUnits u;
  passes::UnrollMicroBatches(u.g.graph);
  const ir::Graph& g = u.g.graph;
  EXPECT_EQ(g.micro_batch_units(), 0);
  // The step op among the units runs before them; the sum is micro-batch
  // 0's share, then an add in micro-batch 1 writing the sum's own value.
  EXPECT_EQ(Names(g), (std::vector<std::string>{"exp", "micro_batch0", "neg0", "tanh0", "micro_batch1",
                                                "neg1", "add1", "tanh1", "mul_scalar"}));
  EXPECT_EQ(g.ops()[1].attrs.Get<int64_t>("index"), 0);
  EXPECT_EQ(g.ops()[4].attrs.Get<int64_t>("index"), 1);
  const ir::Op& add = g.ops()[6];
  EXPECT_EQ(add.inputs, (std::vector<int>{g.ops()[2].outputs[0], g.ops()[5].outputs[0]}));
  EXPECT_EQ(add.outputs[0], u.sum);
  EXPECT_EQ(add.input_sbp, (std::vector<NdSbp>{kB, kB}));
  EXPECT_EQ(g.ops()[8].inputs[0], u.sum);
  // Each copy writes values of its own.
  EXPECT_NE(g.ops()[2].outputs[0], g.ops()[5].outputs[0]);
  EXPECT_EQ(g.ops()[7].inputs[0], g.ops()[5].outputs[0]);
  EXPECT_EQ(g.outputs().at("average"), u.average);
  ir::Verify(g, /*explicit_boxing=*/true);
}

TEST(MicroBatchUnrolling, AGraphWithoutUnitsStaysAsItIs) {
  SmallGraph g("plain", Placement("cpu", std::vector<int>{0}));
  g.graph.MarkOutput("y", g.Op("neg", {g.Input("x", {4, 4}, kB)}, {kB}, {4, 4}, kB));
  const std::string before = g.graph.ToText();
  passes::UnrollMicroBatches(g.graph);
  EXPECT_EQ(g.graph.ToText(), before);
}

TEST(MicroBatchUnrolling, AResultEachMicroBatchComputesIsNamed) {
  HandUnits u;
  u.g.graph.MarkOutput("share", u.share);
  const std::string error = testing::ErrorOf([&] { passes::UnrollMicroBatches(u.g.graph); });
  EXPECT_NE(error.find("result 'share' is %" + std::to_string(u.share) + ", which each micro-batch computes"),
            std::string::npos)
      << error;
}

TEST(MicroBatchUnrolling, AStepOpAmongTheUnitsReadingAMicroBatchsValueIsNamed) {
  HandUnits u(/*step_reads_a_unit=*/true);
  const std::string error = testing::ErrorOf([&] { passes::UnrollMicroBatches(u.g.graph); });
  EXPECT_NE(error.find("op 2 'exp' runs once per step among the micro-batch units and reads %"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("a micro-batch's value"), std::string::npos) << error;
}

// Two stages: the cut and a neg on rank 0, sent to rank 1, where a tanh
// and an exp (marked a gradient, so summed) follow. Built by the passes:
// gradient accumulation makes the units, stage assignment the transfer.
ir::Graph TwoStageUnits(int micro_batches) {
  EnsureLayoutOps();  // to_global, which the passes look up
  const Placement p0("cpu", std::vector<int>{0}), p1("cpu", std::vector<int>{1});
  SmallGraph g("two_stages", p0);
  const int x = g.Input("x", {8, 4}, kB);
  const int mb = g.Op("micro_batch", {x}, {kB}, {8 / micro_batches, 4}, kB,
                      {{"index", int64_t{0}}, {"count", int64_t{micro_batches}}, {"blocks", int64_t{1}}});
  const int h = g.Op("neg", {mb}, {kB}, {8 / micro_batches, 4}, kB);
  const int moved = g.ToGlobal(h, kB, &p1);
  const int y = g.Op("tanh", {moved}, {kB}, {8 / micro_batches, 4}, kB);
  const int grad = g.Op("exp", {y}, {kB}, {8 / micro_batches, 4}, kB);
  g.graph.mutable_op(g.graph.value(grad).producer).backward = true;
  g.graph.MarkGradient(grad);
  g.graph.MarkOutput("update", g.Op("sqrt", {grad}, {kB}, {8 / micro_batches, 4}, kB));
  passes::AccumulateGradients(g.graph, micro_batches);
  passes::AssignStages(g.graph, {{0}, {1}}, {});
  return g.graph;
}

TEST(MicroBatchUnrolling, EachRankCopiesItsOwnStagesUnitsWithTagsItsPeerAgreesOn) {
  const ir::Graph units = TwoStageUnits(4);
  ASSERT_EQ(units.micro_batch_units(), 4);
  EXPECT_EQ((passes::StagesHeldBy(units, 0)), (std::set<int>{0}));
  EXPECT_EQ((passes::StagesHeldBy(units, 1)), (std::set<int>{1}));
  std::map<std::string, int> units_count;
  for (const ir::Op& op : units.ops()) ++units_count[op.name];
  EXPECT_EQ(units_count["send"], 1);
  EXPECT_EQ(units_count["micro_batch_sum"], 1);

  auto census = [](const ir::Graph& g, int stage) {
    std::map<std::string, int> copies;  // op name -> copies of that stage
    std::set<int64_t> tags;
    for (const ir::Op& op : g.ops()) {
      if (op.stage != stage) continue;
      ++copies[op.name];
      if (op.attrs.Has("tag")) tags.insert(op.attrs.Get<int64_t>("tag"));
    }
    return std::make_pair(copies, tags);
  };
  const ir::Graph rank0 = passes::UnrolledForRank(units, 0), rank1 = passes::UnrolledForRank(units, 1);
  ir::Verify(rank0, true);
  ir::Verify(rank1, true);
  const auto [mine0, send_tags] = census(rank0, 0);
  const auto [theirs0, unused0] = census(rank0, 1);
  const auto [mine1, recv_tags] = census(rank1, 1);
  const auto [theirs1, unused1] = census(rank1, 0);
  // Rank 0: four copies of its units, stage 1's once (never run there).
  EXPECT_EQ(mine0.at("micro_batch"), 4);
  EXPECT_EQ(mine0.at("neg"), 4);
  EXPECT_EQ(mine0.at("send"), 4);
  EXPECT_EQ(theirs0.at("recv"), 1);
  EXPECT_EQ(theirs0.at("tanh"), 1);
  EXPECT_EQ(theirs0.at("micro_batch_sum"), 1);
  // Rank 1: four receives, three adds for the sum, the step's op once.
  EXPECT_EQ(mine1.at("recv"), 4);
  EXPECT_EQ(mine1.at("tanh"), 4);
  EXPECT_EQ(mine1.at("add"), 3);
  EXPECT_EQ(mine1.count("micro_batch_sum"), 0u);
  EXPECT_EQ(mine1.at("sqrt"), 1);
  EXPECT_EQ(theirs1.at("send"), 1);
  // Four distinct tags, the same on both sides of the boundary.
  EXPECT_EQ(send_tags.size(), 4u);
  EXPECT_EQ(send_tags, recv_tags);
  // The whole graph's copies hold both sides of every transfer.
  ir::Graph all = units;
  passes::UnrollMicroBatches(all);
  std::map<std::string, int> every;
  for (const ir::Op& op : all.ops()) ++every[op.name];
  EXPECT_EQ(every["send"], 4);
  EXPECT_EQ(every["recv"], 4);
  EXPECT_EQ(every["micro_batch_sum"], 0);
}

}  // namespace
}  // namespace tessel
