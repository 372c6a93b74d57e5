// Dead-code elimination on small graphs: unread results go, results and
// in-place updates stay, and the graph still runs to the same values.
#include <gtest/gtest.h>

#include "graph/ir/graph_ir.pb.h"
#include "graph/ir/tracer.h"
#include "graph/passes/passes.h"
#include "graph/plan/in_order_executor.h"
#include "ops/functional.h"
#include "tests/graph/small_graph.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

TEST(DeadCodeElimination, KeepsWhatResultsAndUpdatesNeed) {
  testing::SmallGraph g("dce", Placement("cpu", {{0, 1}, {2, 3}}));
  const NdSbp s0b({S(0), B()});
  const int x = g.Input("x", {8, 4}, s0b);
  const int a = g.Op("add", {x, x}, {s0b, s0b}, {8, 4}, s0b);
  const int unused = g.Op("mul", {a, a}, {s0b, s0b}, {8, 4}, s0b);
  g.Op("neg", {unused}, {s0b}, {8, 4}, s0b);  // reads a dead value: dead too
  const int t = g.Op("tanh", {a}, {s0b}, {8, 4}, s0b);
  g.graph.MarkOutput("t", t);
  passes::EliminateDeadCode(g.graph);
  ir::Verify(g.graph);
  ASSERT_EQ(g.graph.ops().size(), 2u);
  EXPECT_EQ(g.graph.ops()[0].name, "add");
  EXPECT_EQ(g.graph.ops()[1].name, "tanh");
  EXPECT_EQ(g.graph.ops()[1].id, 1);  // renumbered
  EXPECT_EQ(g.graph.value(t).producer, 1);
  EXPECT_FALSE(g.graph.IsLive(unused));
  // Dead values leave the serialised graph and the text.
  proto::GraphProto p;
  g.graph.ToProto(&p);
  for (const proto::ValueProto& v : p.values()) EXPECT_NE(v.id(), unused);
  EXPECT_EQ(g.graph.ToText().find("mul("), std::string::npos);
}

TEST(DeadCodeElimination, InPlaceUpdatesStayAndTheGraphRuns) {
  // Traced: an SGD update (no result reads it) and an unread product.
  Tensor w = randn({5}, 1), buf = zeros({5});
  Tensor eager_w = w.Clone(), eager_buf = buf.Clone();
  ir::Graph graph("sgd");
  {
    TracingInterpreter tracer(graph);
    InterpreterScope scope(tracer);
    Tensor grad = tracer.Input("g", zeros({5}));
    fn::mul(grad, grad);
    fn::sgd_update(w, grad, buf, 0.1, 0.9, 0.0, false);
    graph.MarkOutput("g2", tracer.ValueOf(fn::add(grad, grad), "g2"));
  }
  ASSERT_EQ(graph.ops().size(), 3u);
  passes::EliminateDeadCode(graph);
  ir::Verify(graph);
  ASSERT_EQ(graph.ops().size(), 2u);
  EXPECT_EQ(graph.ops()[0].name, "sgd_update");
  EXPECT_EQ(graph.ops()[1].name, "add");
  for (uint64_t seed : {2, 3}) {
    Tensor grad = randn({5}, seed);
    Tensor g2 = RunInOrder(graph, {{"g", grad}}).at("g2");
    fn::sgd_update(eager_w, grad, eager_buf, 0.1, 0.9, 0.0, false);
    EXPECT_EQ(g2.ToVector<float>(), fn::add(grad, grad).ToVector<float>());
  }
  EXPECT_EQ(w.ToVector<float>(), eager_w.ToVector<float>());
  EXPECT_EQ(buf.ToVector<float>(), eager_buf.ToVector<float>());
}

}  // namespace
}  // namespace tessel
