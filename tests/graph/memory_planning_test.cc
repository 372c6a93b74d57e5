// Memory planning on small graphs: bytes alive while each op runs, worked
// out by hand (shards, views, in-place updates, results nothing reads,
// ranks outside the placement), and a traced training step whose planned
// peak matches the peak the allocator measures when it runs.
#include "graph/passes/memory_planning.h"
#include "graph/plan/exec_plan.h"

#include <gtest/gtest.h>

#include <cmath>

#include "graph/ir/tracer.h"
#include "graph/plan/graph.h"
#include "graph/plan/in_order_executor.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "tests/graph/small_graph.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

constexpr int64_t kShard = 128 * 64 * 4;  // an f32 [256, 64] S(0) shard on 2 ranks: 32 KiB, a size class

TEST(MemoryPlanning, LiveBytesPerOpFollowLastReadersAndViews) {
  testing::SmallGraph g("mem", Placement("cpu", {0, 1}));
  const NdSbp s0({S(0)});
  const int x = g.Input("x", {256, 64}, s0);
  const int a = g.Op("tanh", {x}, {s0}, {256, 64}, s0);  // op 0
  const int r =
      g.Op("reshape", {a}, {s0}, {256, 8, 8}, s0, {{"shape", std::vector<int64_t>{256, 8, 8}}});  // 1: a view
  const int b = g.Op("mul", {x, x}, {s0, s0}, {256, 64}, s0);                                     // op 2
  const int c = g.Op("add", {r, b}, {s0, s0}, {256, 64}, s0);  // op 3: a (via r), b die
  const int d = g.Op("neg", {c}, {s0}, {256, 64}, s0);         // op 4: c dies
  g.Op("exp", {d}, {s0}, {256, 64}, s0);                       // op 5: nothing reads it
  const int full = g.ToGlobal(d, NdSbp({B()}));                // op 6: a whole copy
  g.graph.MarkOutput("d", d);
  g.graph.MarkOutput("full", full);

  // (The in-order executor frees each slot, here each value, where its plan says.)
  const plan::ExecPlan exec = plan::ExecPlan::Lower(g.graph, 0);
  const std::vector<int>& last = exec.free_after();
  EXPECT_EQ(last[static_cast<size_t>(a)], 1);
  EXPECT_EQ(last[static_cast<size_t>(r)], 3);
  EXPECT_EQ(last[static_cast<size_t>(d)], 7);  // a result: to the end

  for (int rank : {0, 1}) {
    const passes::MemoryPlan plan = passes::PlanMemory(g.graph, rank);
    // a | a (r shares it) | a, b | a, b, c | c, d | d, exp's | d, full
    const std::vector<int64_t> want = {kShard,     kShard,     2 * kShard, 3 * kShard,
                                       2 * kShard, 2 * kShard, 3 * kShard};
    EXPECT_EQ(plan.live_bytes, want) << "rank " << rank;
    EXPECT_EQ(plan.peak_bytes, 3 * kShard);
    EXPECT_EQ(plan.peak_op, 3);
    EXPECT_EQ(plan.peak_op_name, "add");
    EXPECT_EQ(plan.total_bytes, 7 * kShard);  // a, b, c, d, exp's, and full's two shards' worth
    EXPECT_EQ(plan.input_bytes, kShard);
    EXPECT_EQ(plan.variable_bytes, 0);
  }
  // A rank outside the placement holds nothing of it.
  const passes::MemoryPlan outside = passes::PlanMemory(g.graph, 5);
  EXPECT_EQ(outside.peak_bytes, 0);
  EXPECT_EQ(outside.input_bytes, 0);
  EXPECT_EQ(passes::MemoryPlanText(passes::PlanMemory(g.graph, 0)),
            "peak 96.0 KiB of op results (at op 3 'add'), activations at most 0 B, 224.0 KiB without reuse; "
            "variables 0 B, inputs 32.0 KiB");
}

TEST(MemoryPlanning, SizesAreShardsInTheAllocatorsSizeClasses) {
  const Placement mesh("cpu", {{0, 1}, {2, 3}});
  ir::Value v;
  v.shape = Shape({10, 300});
  v.placement = mesh;
  v.nd_sbp = NdSbp({S(0), S(1)});  // rank 0: [5, 150] f32 = 3000 B -> 4 KiB
  EXPECT_EQ(passes::ShardBytes(v, 0), 4096);
  v.nd_sbp = NdSbp({P(), B()});  // partial shards are whole: 12000 B -> 16 KiB
  EXPECT_EQ(passes::ShardBytes(v, 3), 16384);
  EXPECT_EQ(passes::ShardBytes(v, 4), 0);  // not in the placement
  ir::Value local;
  local.shape = Shape({3});
  EXPECT_EQ(passes::ShardBytes(local, 7), 512);  // the smallest class
  EXPECT_EQ(passes::FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(passes::FormatBytes(3 << 20), "3.00 MiB");
}

TEST(MemoryPlanning, InPlaceUpdatesAllocateNothing) {
  Tensor w = randn({4096}, 1), buf = zeros({4096});
  ir::Graph graph("sgd");
  {
    TracingInterpreter tracer(graph);
    InterpreterScope scope(tracer);
    Tensor grad = tracer.Input("g", zeros({4096}));
    Tensor g2 = fn::mul(grad, grad);                   // op 0: 16 KiB
    fn::sgd_update(w, g2, buf, 0.1, 0.9, 0.0, false);  // op 1: writes w and buf
  }
  const passes::MemoryPlan plan = passes::PlanMemory(graph, 0);
  EXPECT_EQ(plan.live_bytes, (std::vector<int64_t>{16384, 16384}));
  EXPECT_EQ(plan.variable_bytes, 2 * 16384);
  EXPECT_EQ(plan.input_bytes, 16384);
}

// The planned peak of a traced training step against the allocator's
// measured peak while the in-order executor runs it.
TEST(MemoryPlanning, PlannedPeakOfATrainingStepMatchesTheMeasuredPeak) {
  Tensor w1 = randn({256, 512}, 1).set_requires_grad(true);
  Tensor w2 = randn({512, 128}, 2).set_requires_grad(true);
  optim::NamedParams params = {{"w1", &w1}, {"w2", &w2}};
  optim::AdamW adamw(params, {.lr = 0.01});
  Graph step("mlp", [&](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor h = fn::gelu(fn::matmul(in.at("x"), w1));
    Tensor y = fn::matmul(fn::tanh(h), w2);
    Tensor loss = fn::mean(fn::mul(y, y), {0, 1});
    loss.backward();
    optim::ClipGradNormTensor(params, 1.0);
    adamw.Step();
    return {{"loss", loss}};
  });
  const Graph::Tensors inputs = {{"x", randn({384, 256}, 3)}};
  const ir::Graph& graph = step.Trace(inputs);
  const passes::MemoryPlan plan = passes::PlanMemory(graph, 0);
  for (int i = 0; i < 3; ++i) {
    RunStats stats;
    RunInOrder(graph, inputs, &stats);
    EXPECT_NEAR(static_cast<double>(stats.peak_bytes), static_cast<double>(plan.peak_bytes),
                0.1 * static_cast<double>(plan.peak_bytes))
        << "run " << i << ": " << passes::MemoryPlanText(plan) << "; measured " << stats.peak_bytes;
  }
  // Freeing at the last reader matters: the step's results would need more
  // than twice the memory otherwise.
  EXPECT_GT(plan.total_bytes, 2 * plan.peak_bytes);
}

}  // namespace
}  // namespace tessel
