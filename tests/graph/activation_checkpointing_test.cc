// Activation checkpointing on a small traced step: the region's forward ops
// are tagged while tracing, the pass recomputes what backward reads of the
// region right before backward first needs it, every backward read takes
// the recomputed value, gradients stay bit for bit eager's, and the planned
// activation peak falls. A checkpoint output of a recomputed multi-output
// op keeps its forward value. Dropout inside a region draws its forward's
// mask again, and its counter moves once.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "graph/autograd.h"
#include "graph/ir/tracer.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/passes.h"
#include "graph/plan/in_order_executor.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

struct TwoBlocks {
  Tensor w1 = randn({64, 64}, 1).set_requires_grad(true);
  Tensor w2 = randn({64, 64}, 2).set_requires_grad(true);
  // Two blocks of tanh(x w) + x; each block is one region when `checkpoint`.
  Tensor Loss(const Tensor& x, bool checkpoint) const {
    Tensor h = x;
    for (const Tensor* w : {&w1, &w2}) {
      std::optional<RecomputeScope> scope;
      if (checkpoint) scope.emplace();
      h = fn::add(fn::tanh(fn::mul_scalar(fn::matmul(h, *w), 0.1)), h);
    }
    return fn::mean(fn::mul(h, h), {0, 1});
  }
};

// Traces loss and both weights' gradients for input x of `rows` rows.
ir::Graph Trace(TwoBlocks& m, bool checkpoint, int64_t rows) {
  ir::Graph graph(checkpoint ? "checkpointed" : "plain");
  TracingInterpreter tracer(graph);
  AutogradInterpreter autograd(tracer);
  InterpreterScope scope(autograd);
  Tensor loss = m.Loss(tracer.Input("x", zeros({rows, 64})), checkpoint);
  loss.backward();
  graph.MarkOutput("loss", tracer.ValueOf(loss, "loss"));
  graph.MarkOutput("g1", tracer.ValueOf(m.w1.grad(), "g1"));
  graph.MarkOutput("g2", tracer.ValueOf(m.w2.grad(), "g2"));
  m.w1.zero_grad();
  m.w2.zero_grad();
  return graph;
}

// Traces loss_of(x, /*checkpoint=*/true) for an input x of `x_shape` and its
// backward, marks the loss and the gradients of `marked` (by name), and
// zeroes every gradient of `params` the trace left.
ir::Graph TraceCheckpointedStep(const std::string& name,
                                const std::function<Tensor(const Tensor&, bool)>& loss_of,
                                const Shape& x_shape,
                                const std::vector<std::pair<std::string, Tensor*>>& marked,
                                const std::vector<Tensor*>& params) {
  ir::Graph graph(name);
  {
    TracingInterpreter tracer(graph);
    AutogradInterpreter autograd(tracer);
    InterpreterScope scope(autograd);
    Tensor loss = loss_of(tracer.Input("x", zeros(x_shape)), true);
    loss.backward();
    graph.MarkOutput("loss", tracer.ValueOf(loss, "loss"));
    for (const auto& [grad_name, p] : marked)
      graph.MarkOutput(grad_name, tracer.ValueOf(p->grad(), grad_name));
  }
  for (Tensor* p : params) p->zero_grad();
  return graph;
}

TEST(ActivationCheckpointing, NestedScopesJoinTheOuterRegion) {
  EXPECT_EQ(CurrentRecomputeRegion(), -1);
  int outer = -1;
  {
    RecomputeScope a;
    outer = CurrentRecomputeRegion();
    EXPECT_GE(outer, 0);
    {
      RecomputeScope b;
      EXPECT_EQ(CurrentRecomputeRegion(), outer);
    }
    EXPECT_EQ(CurrentRecomputeRegion(), outer);
  }
  EXPECT_EQ(CurrentRecomputeRegion(), -1);
  RecomputeScope next;
  EXPECT_NE(CurrentRecomputeRegion(), outer);  // a new region
}

TEST(ActivationCheckpointing, BackwardReadsRecomputedValuesAndGradientsStayEagers) {
  TwoBlocks m;
  ir::Graph graph = Trace(m, true, 256);
  // Tagging: forward ops of two regions, backward ops none.
  std::set<int> regions;
  for (const ir::Op& op : graph.ops()) {
    if (op.backward) {
      EXPECT_EQ(op.recompute_region, -1) << op.id << " " << op.name;
    } else if (op.name == "matmul" || op.name == "tanh") {
      EXPECT_GE(op.recompute_region, 0) << op.id << " " << op.name;
      regions.insert(op.recompute_region);
    }
  }
  ASSERT_EQ(regions.size(), 2u);
  const size_t traced_ops = graph.ops().size();
  // What the forward computes inside the regions, less the regions'
  // outputs (what forward ops after a region read: kept, not recomputed).
  std::set<int> inside;
  for (const ir::Op& op : graph.ops())
    if (!op.backward && op.recompute_region >= 0) inside.insert(op.outputs.begin(), op.outputs.end());
  for (const ir::Op& op : graph.ops()) {
    if (op.backward) continue;
    for (int v : op.inputs) {
      const int producer = graph.value(v).producer;
      if (producer >= 0 && graph.ops()[static_cast<size_t>(producer)].recompute_region != op.recompute_region)
        inside.erase(v);
    }
  }
  ASSERT_FALSE(inside.empty());

  passes::RecomputeCheckpointedRegions(graph);
  ir::Verify(graph);
  // Recomputed ops: per region, the ops whose results backward reads (and
  // what they need of the region), placed before backward first reads it.
  int clones = 0;
  bool forward_done = false;  // the loss (a mean) computed
  for (const ir::Op& op : graph.ops()) {
    if (op.backward && op.recompute_region >= 0) {
      ++clones;
      EXPECT_TRUE(forward_done) << "recomputed inside the forward: op " << op.id;
    }
    forward_done |= !op.backward && op.name == "mean";
    if (!op.backward) continue;
    for (int v : op.inputs)
      EXPECT_EQ(inside.count(v), 0u) << "backward op " << op.id << " '" << op.name
                                     << "' still reads the forward's %" << v;
  }
  EXPECT_GT(clones, 0);
  EXPECT_EQ(graph.ops().size(), traced_ops + static_cast<size_t>(clones));
  EXPECT_NE(graph.ToText().find("[recompute " + std::to_string(*regions.begin()) + "]"), std::string::npos);
  EXPECT_NE(graph.ToText().find("[checkpoint " + std::to_string(*regions.rbegin()) + "]"), std::string::npos);

  // The same values as eager, bit for bit (the recomputation repeats the
  // same ops on the same inputs).
  const Tensor x = randn({256, 64}, 3);
  Tensor loss = m.Loss(x, false);
  loss.backward();
  const std::map<std::string, Tensor> out = RunInOrder(graph, {{"x", x}});
  EXPECT_EQ(out.at("loss").ToVector<float>(), loss.ToVector<float>());
  EXPECT_EQ(out.at("g1").ToVector<float>(), m.w1.grad().ToVector<float>());
  EXPECT_EQ(out.at("g2").ToVector<float>(), m.w2.grad().ToVector<float>());
}

TEST(ActivationCheckpointing, ActivationsAliveAtOnceFallAndThePlanMatchesTheRun) {
  TwoBlocks m;
  ir::Graph plain = Trace(m, false, 512), checkpointed = Trace(m, true, 512);
  for (ir::Graph* g : {&plain, &checkpointed}) {
    passes::RecomputeCheckpointedRegions(*g);
    passes::EliminateDeadCode(*g);
  }
  const passes::MemoryPlan before = passes::PlanMemory(plain, 0), after = passes::PlanMemory(checkpointed, 0);
  // Plain: each block keeps its matmul, scaled and tanh results (128 KiB
  // each at 512 x 64 f32) until its backward; checkpointed, only the
  // blocks' inputs stay, and one block's results exist at a time.
  EXPECT_LT(after.peak_activation_bytes, before.peak_activation_bytes * 3 / 4)
      << passes::MemoryPlanText(before) << " vs " << passes::MemoryPlanText(after);
  const Tensor x = randn({512, 64}, 4);
  for (const ir::Graph* g : {&plain, &checkpointed}) {
    const passes::MemoryPlan plan = passes::PlanMemory(*g, 0);
    RunStats stats;
    RunInOrder(*g, {{"x", x}}, &stats);
    EXPECT_EQ(stats.peak_bytes, plan.peak_bytes) << g->name() << ": " << passes::MemoryPlanText(plan);
  }
}

// A region ending in a two-output op: linear_gelu_tanh's y is read after
// the region (a checkpoint: kept), its pre-activation only by its own
// gradient (recomputed). The next layer's backward reads y before the copy
// is made, so it must keep reading the forward's y.
TEST(ActivationCheckpointing, ACheckpointOutputOfARecomputedOpKeepsItsForwardValue) {
  Tensor w1 = randn({16, 32}, 1).set_requires_grad(true), b1 = randn({32}, 2).set_requires_grad(true);
  Tensor w2 = randn({32, 8}, 3).set_requires_grad(true), b2 = randn({8}, 4).set_requires_grad(true);
  auto loss_of = [&](const Tensor& x, bool checkpoint) {
    Tensor h;
    {
      std::optional<RecomputeScope> scope;
      if (checkpoint) scope.emplace();
      h = fn::linear_gelu_tanh(fn::tanh(x), w1, b1);
    }
    const Tensor z = fn::linear(h, w2, b2);
    return fn::mean(fn::mul(z, z), {0, 1});
  };
  ir::Graph graph = TraceCheckpointedStep("two_outputs", loss_of, {6, 16}, {{"g1", &w1}, {"g2", &w2}},
                                          {&w1, &w2, &b1, &b2});
  passes::RecomputeCheckpointedRegions(graph);
  ir::Verify(graph);  // every value defined before it is read
  const Tensor x = randn({6, 16}, 5);
  Tensor loss = loss_of(x, false);
  loss.backward();
  const std::map<std::string, Tensor> out = RunInOrder(graph, {{"x", x}});
  EXPECT_EQ(out.at("loss").ToVector<float>(), loss.ToVector<float>());
  EXPECT_EQ(out.at("g1").ToVector<float>(), w1.grad().ToVector<float>());
  EXPECT_EQ(out.at("g2").ToVector<float>(), w2.grad().ToVector<float>());
}

// Dropout inside a region: the layer reads its stream's position as a value
// (rng_offset), draws, and moves the counter on in place (rng_advance). The
// update runs once, in forward; the position is kept (recomputing it would
// read the moved counter), so the recomputed dropout draws the forward's
// mask. Two calls of the graph give eager's two steps: new masks each time.
TEST(ActivationCheckpointing, DropoutInARegionRecomputesItsMaskAndAdvancesOnce) {
  Tensor w1 = randn({16, 32}, 1).set_requires_grad(true), w2 = randn({32, 8}, 2).set_requires_grad(true);
  Tensor counter = Tensor::FromVector<int64_t>({0}, Shape(std::vector<int64_t>{}));
  auto loss_of = [&](const Tensor& x, bool checkpoint) {
    Tensor h;
    {
      std::optional<RecomputeScope> scope;
      if (checkpoint) scope.emplace();
      h = fn::tanh(fn::matmul(x, w1));
      h = fn::dropout(h, fn::rng_offset(counter, h), 0.5, 7);
      fn::rng_advance(counter, h);
      h = fn::tanh(h);
    }
    const Tensor z = fn::matmul(h, w2);
    return fn::mean(fn::mul(z, z), {0, 1});
  };
  ir::Graph graph = TraceCheckpointedStep("dropout_in_region", loss_of, {6, 16}, {{"g1", &w1}}, {&w1, &w2});
  passes::RecomputeCheckpointedRegions(graph);
  ir::Verify(graph);
  int dropouts = 0, offsets = 0, advances = 0;
  for (const ir::Op& op : graph.ops()) {
    dropouts += op.name == "dropout";
    offsets += op.name == "rng_offset";
    advances += op.name == "rng_advance";
  }
  EXPECT_EQ(dropouts, 3);  // the forward's, its recomputed copy, and the gradient's
  EXPECT_EQ(offsets, 1);
  EXPECT_EQ(advances, 1);
  const Tensor x = randn({6, 16}, 5);
  counter.CopyFrom(Tensor::FromVector<int64_t>({0}, counter.shape()));
  std::vector<std::vector<float>> graph_losses, graph_grads;
  for (int step = 0; step < 2; ++step) {
    const std::map<std::string, Tensor> out = RunInOrder(graph, {{"x", x}});
    graph_losses.push_back(out.at("loss").ToVector<float>());
    graph_grads.push_back(out.at("g1").ToVector<float>());
  }
  EXPECT_EQ(counter.ToVector<int64_t>(), std::vector<int64_t>{2 * 6 * 32});
  counter.CopyFrom(Tensor::FromVector<int64_t>({0}, counter.shape()));
  for (int step = 0; step < 2; ++step) {
    Tensor loss = loss_of(x, false);
    loss.backward();
    EXPECT_EQ(graph_losses[step], loss.ToVector<float>()) << "step " << step;
    EXPECT_EQ(graph_grads[step], w1.grad().ToVector<float>()) << "step " << step;
    w1.zero_grad();
    w2.zero_grad();
  }
  EXPECT_NE(graph_losses[0], graph_losses[1]);  // a new mask at the second step
}

}  // namespace
}  // namespace tessel
