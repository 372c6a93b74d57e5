// The runs of a step (graph/passes/step_runs.h) on small graphs: a unit
// runs once per micro-batch with its own slots and its micro-batch's index,
// sums run as each micro-batch ends, the step's ops keep their side of the
// units, each stage's transfers take tags both sides agree on, and what
// cannot run as units is named. The units run in order and give the
// values the micro-batches sum to.
#include "graph/passes/step_runs.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "graph/passes/passes.h"
#include "graph/plan/exec_plan.h"
#include "graph/plan/in_order_executor.h"
#include "ops/functional.h"
#include "tests/graph/small_graph.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::SmallGraph;

const NdSbp kB({B()});

std::vector<std::string> Names(const ir::Graph& g, const std::vector<passes::OpRun>& runs) {
  std::vector<std::string> names;
  for (const passes::OpRun& r : runs)
    names.push_back(g.ops()[static_cast<size_t>(r.op)].name +
                    (r.micro_batch >= 0 ? std::to_string(r.micro_batch) : std::string()));
  return names;
}

// Units written out by hand: x cut into micro-batches, negated (summed over
// them, then read by one more unit), a step op among the units that reads
// only the input, and the average after them.
struct HandUnits {
  SmallGraph g{"units", Placement(DeviceType::kCPU, {CurrentRank()})};
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

TEST(StepRuns, UnitsRunPerMicroBatchWithRunningSums) {
  HandUnits u;
  const ir::Graph& g = u.g.graph;
  const passes::StepRuns runs(g);
  EXPECT_EQ(runs.micro_batches(), 2);
  EXPECT_EQ(runs.runs(), 4 * 2 + 2);
  // The step op among the units runs before them; the sum runs as each
  // micro-batch's share is made.
  EXPECT_EQ(Names(g, runs.ProgramOrder()),
            (std::vector<std::string>{"exp", "micro_batch0", "neg0", "micro_batch_sum0", "tanh0",
                                      "micro_batch1", "neg1", "micro_batch_sum1", "tanh1", "mul_scalar"}));
  // A unit's values have a slot per micro-batch, the first the value's id.
  EXPECT_TRUE(runs.per_micro_batch(u.share));
  EXPECT_FALSE(runs.per_micro_batch(u.x));
  EXPECT_EQ(runs.Slot(u.share, 0), u.share);
  EXPECT_GE(runs.Slot(u.share, 1), static_cast<int>(g.values().size()));
  EXPECT_EQ(runs.Slot(u.x, 1), u.x);
  // Micro-batch 1's sum reads the sum so far, then its share; the step
  // reads the last.
  std::vector<int> slots;
  runs.InputSlots(g.ops()[3], 1, &slots);
  EXPECT_EQ(slots, (std::vector<int>{runs.Slot(u.sum, 0), runs.Slot(u.share, 1)}));
  runs.InputSlots(g.ops()[3], 0, &slots);
  EXPECT_EQ(slots, (std::vector<int>{u.share}));
  EXPECT_EQ(runs.Slot(u.sum, -1), runs.Slot(u.sum, 1));
  runs.InputSlots(g.ops()[5], -1, &slots);
  EXPECT_EQ(slots, (std::vector<int>{runs.Slot(u.sum, 1)}));
  // Lowered once: the cut takes each micro-batch's index, the sum is the
  // add kernel.
  const plan::ExecPlan plan = plan::ExecPlan::Lower(g, CurrentRank());
  EXPECT_EQ(plan.instructions_run(), 6);
  ASSERT_EQ(plan.at(0).micro_batch_attrs.size(), 2u);
  EXPECT_EQ(plan.at(0).micro_batch_attrs[1].Get<int64_t>("index"), 1);
  EXPECT_EQ(plan.at(3).kind, plan::Instruction::Kind::kSum);
  EXPECT_TRUE(plan.at(1).unit);
  EXPECT_FALSE(plan.at(2).unit);
  // Run in order: the average of the two micro-batches' negations.
  const Tensor x = randn({4, 4}, 7).to_global(u.g.graph.value(u.x).placement, {B()});
  const Tensor average = RunInOrder(plan, {{"x", x}}).at("average");
  const std::vector<float> v = x.to_local().ToVector<float>(), got = average.to_local().ToVector<float>();
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(got[i], -0.5f * (v[i] + v[i + 8])) << i;
}

TEST(StepRuns, AGraphWithoutUnitsRunsEachOpOnce) {
  SmallGraph g("plain", Placement("cpu", std::vector<int>{0}));
  g.graph.MarkOutput("y", g.Op("neg", {g.Input("x", {4, 4}, kB)}, {kB}, {4, 4}, kB));
  const passes::StepRuns runs(g.graph);
  EXPECT_EQ(runs.micro_batches(), 1);
  EXPECT_EQ(runs.runs(), 1);
  EXPECT_EQ(runs.slots(), static_cast<int>(g.graph.values().size()));
  EXPECT_EQ(runs.ProgramOrder(), (std::vector<passes::OpRun>{{0, -1}}));
}

TEST(StepRuns, AResultEachMicroBatchComputesIsNamed) {
  HandUnits u;
  u.g.graph.MarkOutput("share", u.share);
  const std::string error = testing::ErrorOf([&] { passes::StepRuns runs(u.g.graph); });
  EXPECT_NE(error.find("result 'share' is %" + std::to_string(u.share) + ", which each micro-batch computes"),
            std::string::npos)
      << error;
}

TEST(StepRuns, AStepOpReadingAMicroBatchsValueIsNamed) {
  HandUnits u(/*step_reads_a_unit=*/true);
  const std::string error = testing::ErrorOf([&] { passes::StepRuns runs(u.g.graph); });
  EXPECT_NE(error.find("op 2 'exp' runs once per step and reads %" + std::to_string(u.share) +
                       ", a micro-batch's value"),
            std::string::npos)
      << error;
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

TEST(StepRuns, EachStagesTransfersTakeTagsItsPeerAgreesOn) {
  const ir::Graph units = TwoStageUnits(4);
  ASSERT_EQ(units.micro_batch_units(), 4);
  EXPECT_EQ((passes::StagesHeldBy(units, 0)), (std::set<int>{0}));
  EXPECT_EQ((passes::StagesHeldBy(units, 1)), (std::set<int>{1}));
  const passes::StepRuns runs(units);
  std::set<uint32_t> send_tags, recv_tags;
  int sends = 0, sums = 0;
  for (const ir::Op& op : units.ops()) {
    sums += op.name == "micro_batch_sum";
    if (op.name != "send" && op.name != "recv") continue;
    sends += op.name == "send";
    EXPECT_TRUE(runs.unit(op.id)) << op.name;
    const auto tag = static_cast<uint32_t>(op.attrs.Get<int64_t>("tag"));
    for (int k = 0; k < 4; ++k) (op.name == "send" ? send_tags : recv_tags).insert(runs.Tag(op.id, tag, k));
  }
  EXPECT_EQ(sends, 1);  // once, run per micro-batch
  EXPECT_EQ(sums, 1);
  // Four distinct tags, the same on both sides of the boundary.
  EXPECT_EQ(send_tags.size(), 4u);
  EXPECT_EQ(send_tags, recv_tags);
  // Rank 1 lowers its stage's ops: four receives and four sums a step.
  std::vector<char> stage1(units.ops().size(), 0);
  for (const ir::Op& op : units.ops()) stage1[static_cast<size_t>(op.id)] = op.stage < 0 || op.stage == 1;
  const plan::ExecPlan plan = plan::ExecPlan::Lower(units, 1, &stage1);
  std::map<std::string, int> runs_of;
  for (const passes::OpRun& r : plan.program_order()) ++runs_of[units.ops()[static_cast<size_t>(r.op)].name];
  EXPECT_EQ(runs_of["recv"], 4);
  EXPECT_EQ(runs_of["tanh"], 4);
  EXPECT_EQ(runs_of["micro_batch_sum"], 4);
  EXPECT_EQ(runs_of["sqrt"], 1);
  EXPECT_EQ(runs_of.count("send"), 0u);
}

// A rank numbers its own runs and slots: stage 1's tables hold its ops'
// runs and the extra slots of the values they read or write, not stage 0's,
// and a slot of stage 0's values past micro-batch 0 is an error, not an
// alias of micro-batch 0's.
TEST(StepRuns, ARankNumbersOnlyItsOwnRunsAndSlots) {
  const ir::Graph units = TwoStageUnits(4);
  const passes::StepRuns all(units);
  std::vector<char> stage1(units.ops().size(), 0);
  int stage1_runs = 0, stage0_unit_value = -1;
  std::set<int> stage1_values;
  for (const ir::Op& op : units.ops()) {
    stage1[static_cast<size_t>(op.id)] = op.stage < 0 || op.stage == 1;
    if (stage1[static_cast<size_t>(op.id)]) {
      stage1_runs += all.RunsOf(op.id);
      for (int v : op.inputs) stage1_values.insert(v);
      for (int v : op.outputs) stage1_values.insert(v);
    }
  }
  for (const ir::Op& op : units.ops())
    if (op.stage == 0 && all.unit(op.id) && op.name != "send")
      for (int v : op.outputs)
        if (!stage1_values.count(v)) stage0_unit_value = v;
  ASSERT_GE(stage0_unit_value, 0);
  const passes::StepRuns mine(units, &stage1);
  EXPECT_EQ(mine.runs(), stage1_runs);
  EXPECT_LT(mine.runs(), all.runs());
  int per_micro_batch = 0;
  for (int v : stage1_values) per_micro_batch += mine.per_micro_batch(v);
  EXPECT_GT(per_micro_batch, 0);
  EXPECT_EQ(mine.slots(), static_cast<int>(units.values().size()) + 3 * per_micro_batch);
  EXPECT_LT(mine.slots(), all.slots());
  // Every slot of this rank's runs is distinct per micro-batch and in range.
  std::set<int> seen;
  std::vector<int> in;
  for (const passes::OpRun& r : mine.ProgramOrder()) {
    const ir::Op& op = units.ops()[static_cast<size_t>(r.op)];
    EXPECT_TRUE(stage1[static_cast<size_t>(r.op)]) << op.name;
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const int slot = mine.OutputSlot(op, o, r.micro_batch);
      EXPECT_LT(slot, mine.slots());
      if (!mine.sum(op.id)) {
        EXPECT_TRUE(seen.insert(slot).second) << op.name << r.micro_batch;
      }
    }
    mine.InputSlots(op, r.micro_batch, &in);
    for (int slot : in) EXPECT_LT(slot, mine.slots());
  }
  EXPECT_EQ(mine.Slot(stage0_unit_value, 0), stage0_unit_value);
  const std::string error = testing::ErrorOf([&] { mine.Slot(stage0_unit_value, 2); });
  EXPECT_NE(error.find("%" + std::to_string(stage0_unit_value) + " of micro-batch 2 has no slot"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace tessel
