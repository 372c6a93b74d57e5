// Tracing into the graph IR and running it in order: forward and backward
// recorded by the same model code give eager's values; variables persist
// and take in-place updates; the text, dot and protobuf forms describe the
// graph; misuse is named.
#include "graph/ir/graph_ir.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph/autograd.h"
#include "graph/ir/graph_ir.pb.h"
#include "graph/ir/tracer.h"
#include "graph/plan/in_order_executor.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

// A two-layer MLP's loss: the same code traces and runs eagerly.
Tensor MlpLoss(const Tensor& x, const Tensor& w1, const Tensor& w2) {
  Tensor h = fn::tanh(fn::matmul(x, w1));
  Tensor y = fn::matmul(h, w2);
  return fn::sum(fn::mul(y, y), {0, 1});
}

void ExpectNear(const Tensor& a, const Tensor& b, const std::string& what) {
  std::vector<float> av = a.to_local().ToVector<float>(), bv = b.to_local().ToVector<float>();
  ASSERT_EQ(av.size(), bv.size()) << what;
  for (size_t i = 0; i < av.size(); ++i)
    EXPECT_NEAR(av[i], bv[i], 1e-5 * (1 + std::abs(bv[i]))) << what << "[" << i << "]";
}

// Traces loss and gradients of the MLP into `graph`; the parameters'
// gradients are cleared afterwards (the trace leaves lazy ones).
void TraceMlp(ir::Graph& graph, const Tensor& example_x, Tensor& w1, Tensor& w2) {
  TracingInterpreter tracer(graph);
  AutogradInterpreter autograd(tracer);
  InterpreterScope scope(autograd);
  tracer.AddVariable("w1", w1);
  tracer.AddVariable("w2", w2);
  Tensor x = tracer.Input("x", example_x);
  Tensor loss = MlpLoss(x, w1, w2);
  loss.backward();
  graph.MarkOutput("loss", tracer.ValueOf(loss, "loss"));
  graph.MarkOutput("grad/w1", tracer.ValueOf(w1.grad(), "grad of w1"));
  graph.MarkOutput("grad/w2", tracer.ValueOf(w2.grad(), "grad of w2"));
  w1.zero_grad();
  w2.zero_grad();
}

TEST(GraphIr, TracedForwardAndBackwardMatchEager) {
  Tensor w1 = randn({8, 16}, 1).set_requires_grad(true);
  Tensor w2 = randn({16, 3}, 2).set_requires_grad(true);
  ir::Graph graph("mlp");
  TraceMlp(graph, zeros({4, 8}), w1, w2);
  EXPECT_FALSE(w1.grad().defined());
  // Nothing ran while tracing; the graph runs on any x of the traced spec.
  for (uint64_t seed : {11, 12}) {
    Tensor x = randn({4, 8}, seed);
    std::map<std::string, Tensor> out = RunInOrder(graph, {{"x", x}});
    Tensor loss = MlpLoss(x, w1, w2);
    loss.backward();
    ExpectNear(out.at("loss"), loss, "loss");
    ExpectNear(out.at("grad/w1"), w1.grad(), "grad w1");
    ExpectNear(out.at("grad/w2"), w2.grad(), "grad w2");
    EXPECT_FALSE(out.at("loss").is_lazy());
    w1.zero_grad();
    w2.zero_grad();
  }
  // The backward ops are recorded from the OpDef gradients: tanh's and
  // matmul's gradient ops appear after the forward.
  int matmuls = 0;
  for (const ir::Op& op : graph.ops()) matmuls += op.name == "matmul";
  EXPECT_EQ(matmuls, 2 + 3);  // forward 2; backward dW2, dH, dW1 (dX is not needed)
}

TEST(GraphIr, GlobalValuesCarryTheInferredLayouts) {
  const Placement one("cpu", std::vector<int>{0});
  Tensor w = randn({8, 4}, one, {B()}, 3);
  ir::Graph graph("global");
  TracingInterpreter tracer(graph);
  const Tensor example = zeros({6, 8}, one, {S(0)});
  {
    InterpreterScope scope(tracer);
    Tensor x = tracer.Input("x", example);
    Tensor y = fn::matmul(x, w);
    EXPECT_TRUE(y.is_lazy());
    EXPECT_EQ(y.nd_sbp(), NdSbp({S(0)}));
    graph.MarkOutput("y", tracer.ValueOf(y, "y"));
  }
  const ir::Op& mm = graph.ops().at(0);
  EXPECT_EQ(mm.name, "matmul");
  EXPECT_EQ(mm.input_sbp, (std::vector<NdSbp>{NdSbp({S(0)}), NdSbp({B()})}));
  EXPECT_EQ(mm.output_sbp, (std::vector<NdSbp>{NdSbp({S(0)})}));
  Tensor x = randn({6, 8}, one, {S(0)}, 4);
  ExpectNear(RunInOrder(graph, {{"x", x}}).at("y"), fn::matmul(x, w), "y");
}

TEST(GraphIr, VariablesTakeInPlaceUpdatesAcrossCalls) {
  Tensor w = randn({5}, 5);
  Tensor buf = zeros({5});
  Tensor eager_w = w.Clone(), eager_buf = buf.Clone();
  ir::Graph graph("sgd");
  TracingInterpreter tracer(graph);
  {
    InterpreterScope scope(tracer);
    Tensor g = tracer.Input("g", zeros({5}));
    fn::sgd_update(w, g, buf, 0.1, 0.9, 0.01, false);
    // A traced value cannot be updated in place: only variables can.
    Tensor traced = fn::add(g, g);
    std::string msg = ErrorOf([&] { fn::sgd_update(traced, g, buf, 0.1, 0.9, 0.01, false); });
    EXPECT_NE(msg.find("only variables"), std::string::npos) << msg;
  }
  for (uint64_t seed : {21, 22, 23}) {
    Tensor g = randn({5}, seed);
    RunInOrder(graph, {{"g", g}});
    fn::sgd_update(eager_w, g, eager_buf, 0.1, 0.9, 0.01, false);
  }
  ExpectNear(w, eager_w, "parameter after 3 graph calls");
  ExpectNear(buf, eager_buf, "momentum after 3 graph calls");
}

TEST(GraphIr, TextDotAndProtoDescribeTheGraph) {
  Tensor w1 = randn({8, 16}, 1).set_requires_grad(true);
  Tensor w2 = randn({16, 3}, 2).set_requires_grad(true);
  ir::Graph graph("mlp");
  TraceMlp(graph, zeros({4, 8}), w1, w2);
  const std::string text = graph.ToText();
  EXPECT_NE(text.find("input \"x\" : f32 [4, 8]"), std::string::npos) << text;
  EXPECT_NE(text.find("variable \"w1\" : f32 [8, 16]"), std::string::npos) << text;
  EXPECT_NE(text.find("= matmul(%"), std::string::npos) << text;
  EXPECT_NE(text.find("{transpose_a=false, transpose_b=false}"), std::string::npos) << text;
  EXPECT_NE(text.find("output \"loss\""), std::string::npos) << text;
  const std::string dot = graph.ToDot();
  EXPECT_EQ(dot.rfind("digraph \"mlp\" {", 0), 0u) << dot;
  EXPECT_NE(dot.find("[shape=box, label=\"0: matmul\"]"), std::string::npos) << dot;
  proto::GraphProto p;
  graph.ToProto(&p);
  proto::GraphProto back;
  ASSERT_TRUE(back.ParseFromString(p.SerializeAsString()));
  EXPECT_EQ(back.ops_size(), static_cast<int>(graph.ops().size()));
  EXPECT_EQ(back.values_size(), static_cast<int>(graph.values().size()));
  EXPECT_EQ(back.ops(0).op(), "matmul");
  ASSERT_EQ(back.ops(0).attrs_size(), 2);
  EXPECT_EQ(back.ops(0).attrs(0).name(), "transpose_a");
  EXPECT_FALSE(back.ops(0).attrs(0).value().b());
  ASSERT_EQ(back.outputs_size(), 3);
  EXPECT_EQ(back.outputs(2).name(), "loss");  // in name order
  EXPECT_EQ(back.outputs(2).value(), graph.outputs().at("loss"));
  // Tracing the same code again gives the same graph, byte for byte.
  Tensor v1 = w1, v2 = w2;
  ir::Graph again("mlp");
  TraceMlp(again, zeros({4, 8}), v1, v2);
  proto::GraphProto q;
  again.ToProto(&q);
  EXPECT_EQ(p.SerializeAsString(), q.SerializeAsString());
}

// The ops passes and executors treat specially are typed by the graph that
// holds them: AddOp types what it appends, SetOps what a pass built or
// renamed (a pass sets names, never kinds).
TEST(GraphIr, OpsAreTypedByTheGraphThatHoldsThem) {
  EXPECT_EQ(ir::KindOf("to_global"), ir::OpKind::kToGlobal);
  EXPECT_EQ(ir::KindOf("from_local"), ir::OpKind::kFromLocal);
  EXPECT_EQ(ir::KindOf("send"), ir::OpKind::kSend);
  EXPECT_EQ(ir::KindOf("recv"), ir::OpKind::kRecv);
  EXPECT_EQ(ir::KindOf("all_reduce_bucket"), ir::OpKind::kGradientBucket);
  EXPECT_EQ(ir::KindOf("micro_batch"), ir::OpKind::kMicroBatch);
  EXPECT_EQ(ir::KindOf("micro_batch_sum"), ir::OpKind::kMicroBatchSum);
  EXPECT_EQ(ir::KindOf("matmul"), ir::OpKind::kKernel);
  EXPECT_EQ(ir::KindOf("sendx"), ir::OpKind::kKernel);

  ir::Graph graph("kinds");
  ir::Value spec;
  spec.shape = Shape({4});
  spec.dtype = DType::kFloat32;
  const int x = graph.AddInput("x", spec);
  const int y = graph.AddOp("neg", {}, {x}, {spec})[0];
  const int z = graph.AddOp("micro_batch_sum", {}, {y}, {spec})[0];
  EXPECT_EQ(graph.ops()[0].kind, ir::OpKind::kKernel);
  EXPECT_EQ(graph.ops()[1].kind, ir::OpKind::kMicroBatchSum);
  std::vector<ir::Op> ops = graph.ops();
  ops[0].name = "recv";  // (a pass's rewrite; kind left as it was)
  ops[1].name = "exp";
  graph.SetOps(ops);
  EXPECT_EQ(graph.ops()[0].kind, ir::OpKind::kRecv);
  EXPECT_EQ(graph.ops()[1].kind, ir::OpKind::kKernel);
  EXPECT_EQ(graph.value(z).producer, 1);
}

TEST(GraphIr, MisuseIsNamed) {
  Tensor w1 = randn({8, 16}, 1).set_requires_grad(true);
  Tensor w2 = randn({16, 3}, 2).set_requires_grad(true);
  ir::Graph graph("mlp");
  TraceMlp(graph, zeros({4, 8}), w1, w2);
  std::string msg = ErrorOf([&] { RunInOrder(graph, {{"x", zeros({5, 8})}}); });
  EXPECT_NE(msg.find("input 'x' is f32 [5, 8]; the graph was traced with f32 [4, 8]"), std::string::npos)
      << msg;
  msg = ErrorOf([&] { RunInOrder(graph, {}); });
  EXPECT_NE(msg.find("input 'x' (f32 [4, 8]) was not given"), std::string::npos) << msg;
  msg = ErrorOf([&] { RunInOrder(graph, {{"x", zeros({4, 8})}, {"labels", zeros({4})}}); });
  EXPECT_NE(msg.find("has no input 'labels' (inputs: x)"), std::string::npos) << msg;

  // A traced value used eagerly after the build, or read as data during it.
  ir::Graph g2("g2");
  TracingInterpreter tracer(g2);
  Tensor lazy;
  {
    InterpreterScope scope(tracer);
    lazy = fn::relu(tracer.Input("x", zeros({3})));
    msg = ErrorOf([&] { lazy.data<float>(); });
    EXPECT_NE(msg.find("data access of a lazy tensor"), std::string::npos) << msg;
    // A lazy value of another graph.
    ir::Graph other("other");
    TracingInterpreter other_tracer(other);
    Tensor foreign = other_tracer.Input("y", zeros({3}));
    msg = ErrorOf([&] { fn::add(lazy, foreign); });
    EXPECT_NE(msg.find("input b is a lazy tensor"), std::string::npos) << msg;
    EXPECT_NE(msg.find("of another graph"), std::string::npos) << msg;
    // from_local needs its logical shape in a graph.
    const Placement one("cpu", std::vector<int>{0});
    msg = ErrorOf([&] { lazy.to_global(one, {S(0)}); });
    EXPECT_NE(msg.find("without its logical shape"), std::string::npos) << msg;
  }
  msg = ErrorOf([&] { fn::add(lazy, lazy); });
  EXPECT_NE(msg.find("op 'add': input a is lazy"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tessel
