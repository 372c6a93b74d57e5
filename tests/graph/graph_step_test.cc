// Graph (graph/plan/graph.h): a whole training step — forward, backward,
// clipping and AdamW — captured once and run many times gives eager's
// values, reads the learning rate at each call, counts AdamW's steps in
// place, draws dropout's masks as eager does at every call, traces again
// only for new input specs, and refuses what it cannot capture (layers with
// per-call host state), naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "graph/ir/meta.h"
#include "graph/plan/graph.h"
#include "graph/plan/in_order_executor.h"
#include "layers/optimizer.h"
#include "layers/regularization.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tiny_mlp.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

using Mlp = testing::TinyMlp;

// One eager training step; returns the loss and the gradient norm.
std::pair<float, double> EagerStep(Mlp& m, optim::AdamW& adamw, const Tensor& x, double max_norm) {
  Tensor loss = m.Loss(x);
  loss.backward();
  const double norm = optim::ClipGradNorm(m.params(), max_norm);
  adamw.Step();
  return {loss.ToVector<float>()[0], norm};
}

TEST(GraphStep, TrainStepsMatchEagerAndReadTheLearningRateEachCall) {
  Mlp eager, captured;
  optim::AdamW eager_adamw(eager.params(), {.lr = 0.05}), graph_adamw(captured.params(), {.lr = 0.05});
  Graph step("mlp_train_step", [&](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor loss = captured.Loss(in.at("x"));
    loss.backward();
    Tensor norm = optim::ClipGradNormTensor(captured.params(), 1.0);
    graph_adamw.Step();
    return {{"loss", loss}, {"grad_norm", norm}};
  });
  for (int i = 0; i < 6; ++i) {
    const Tensor x = randn({5, 8}, 100 + i);
    const double lr = i < 3 ? 0.05 : 0.01;  // a schedule: the captured step must follow it
    eager_adamw.set_lr(lr);
    graph_adamw.set_lr(lr);
    auto [want_loss, want_norm] = EagerStep(eager, eager_adamw, x, 1.0);
    Graph::Tensors out = step({{"x", x}});
    EXPECT_NEAR(out.at("loss").ToVector<float>()[0], want_loss, 1e-6 * (1 + std::abs(want_loss))) << i;
    EXPECT_NEAR(out.at("grad_norm").ToVector<float>()[0], want_norm, 1e-5 * (1 + want_norm)) << i;
  }
  EXPECT_EQ(step.traced_graphs(), 1u);
  // The parameters are the graph's variables: updated in place, equal to eager's.
  EXPECT_EQ(captured.w1.ToVector<float>(), eager.w1.ToVector<float>());
  EXPECT_EQ(captured.w2.ToVector<float>(), eager.w2.ToVector<float>());
  EXPECT_FALSE(captured.w1.grad().defined());
  // set_lr reaches the captured step: at lr 0 a step changes nothing.
  graph_adamw.set_lr(0.0);
  const std::vector<float> before = captured.w1.ToVector<float>();
  step({{"x", randn({5, 8}, 99)}});
  EXPECT_EQ(captured.w1.ToVector<float>(), before);
  graph_adamw.set_lr(0.05);
  step({{"x", randn({5, 8}, 99)}});
  EXPECT_NE(captured.w1.ToVector<float>(), before);
  // The update is one op per parameter in the graph, reading step and lr tensors.
  const ir::Graph& graph = step.Trace({{"x", randn({5, 8}, 7)}});
  int updates = 0;
  for (const ir::Op& op : graph.ops()) updates += op.name == "adamw_update";
  EXPECT_EQ(updates, 2);
  EXPECT_EQ(step.traced_graphs(), 1u);
  // A new batch size traces a second graph.
  step({{"x", randn({2, 8}, 8)}});
  EXPECT_EQ(step.traced_graphs(), 2u);
}

TEST(GraphStep, AdamWCountsItsStepsInPlace) {
  Mlp m;
  optim::AdamW adamw(m.params(), {.lr = 0.01});
  Graph step("count", [&](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor loss = m.Loss(in.at("x"));
    loss.backward();
    adamw.Step();
    return {{"loss", loss}};
  });
  // Bias correction depends on the step: with a fixed input, the captured
  // step's third update equals eager's third, not its first again.
  Mlp ref;
  optim::AdamW ref_adamw(ref.params(), {.lr = 0.01});
  const Tensor x = randn({5, 8}, 3);
  for (int i = 0; i < 3; ++i) {
    step({{"x", x}});
    Tensor loss = ref.Loss(x);
    loss.backward();
    ref_adamw.Step();
  }
  EXPECT_EQ(m.w1.ToVector<float>(), ref.w1.ToVector<float>());
}

// The MLP with dropout on its hidden layer.
Tensor DropoutLoss(const Mlp& m, layers::Dropout& dropout, const Tensor& x) {
  Tensor y = fn::matmul(dropout(fn::tanh(fn::matmul(x, m.w1))), m.w2);
  return fn::mean(fn::mul(y, y), {0, 1});
}

// Dropout's counter is a variable the graph advances: every call draws the
// masks eager code draws at that step — one per micro-batch under gradient
// accumulation — and the layer's counter ends where eager's does.
TEST(GraphStep, DropoutDrawsEagersMasksAtEveryCall) {
  for (int micro_batches : {1, 2}) {
    Mlp eager, captured;
    layers::Dropout eager_dropout(0.3), graph_dropout(0.3);
    optim::AdamW eager_adamw(eager.params(), {.lr = 0.05}), graph_adamw(captured.params(), {.lr = 0.05});
    Graph step("dropout_step",
               [&](const Graph::Tensors& in) -> Graph::Tensors {
                 Tensor loss = DropoutLoss(captured, graph_dropout, in.at("x"));
                 loss.backward();
                 graph_adamw.Step();
                 return {{"loss", loss}};
               },
               {.micro_batches = micro_batches});
    std::vector<float> losses;
    for (int i = 0; i < 3; ++i) {
      const Tensor x = randn({4, 8}, 200 + i);
      const int64_t rows = 4 / micro_batches;
      float want = 0;
      for (int j = 0; j < micro_batches; ++j) {
        Tensor loss = DropoutLoss(eager, eager_dropout, fn::slice(x, 0, j * rows, (j + 1) * rows));
        fn::mul_scalar(loss, 1.0 / micro_batches).backward();
        want += loss.ToVector<float>()[0] / static_cast<float>(micro_batches);
      }
      eager_adamw.Step();
      const float got = step({{"x", x}}).at("loss").ToVector<float>()[0];
      EXPECT_NEAR(got, want, 1e-6 * (1 + std::abs(want))) << micro_batches << " micro-batches, step " << i;
      losses.push_back(got);
    }
    EXPECT_EQ(step.traced_graphs(), 1u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(captured.w1.ToVector<float>()[i], eager.w1.ToVector<float>()[i], 1e-6);
    // 3 steps of 4 rows x 16 hidden features drawn.
    EXPECT_EQ(graph_dropout.NamedRngCounters().at(0).second->Get(), 3 * 4 * 16);
    EXPECT_EQ(eager_dropout.NamedRngCounters().at(0).second->Get(), 3 * 4 * 16);
  }
}

TEST(GraphStep, WhatCannotBeCapturedIsNamed) {
  Mlp m;
  layers::DropPath drop_path(0.1);
  Graph with_drop_path("drop_path", [&](const Graph::Tensors& in) -> Graph::Tensors {
    return {{"y", drop_path(m.Loss(in.at("x")))}};
  });
  std::string error = ErrorOf([&] { with_drop_path({{"x", randn({5, 8}, 1)}}); });
  EXPECT_NE(error.find("DropPath with p=0.1 makes its masks on the host"), std::string::npos) << error;
  // Eagerly the same layer works.
  EXPECT_TRUE(drop_path(randn({5, 8}, 1)).defined());

  Graph no_results("empty", [](const Graph::Tensors&) { return Graph::Tensors{}; });
  error = ErrorOf([&] { no_results({{"x", randn({5, 8}, 1)}}); });
  EXPECT_NE(error.find("graph 'empty': the build function returned no results"), std::string::npos) << error;

  Graph step("step", [&](const Graph::Tensors& in) -> Graph::Tensors {
    return {{"loss", m.Loss(in.at("x"))}};
  });
  step({{"x", randn({5, 8}, 1)}});
  error = ErrorOf([&] { step({{"y", randn({5, 8}, 1)}}); });
  EXPECT_NE(
      error.find("graph 'step': the build function looked up a tensor the call did not give (inputs: 'y')"),
      std::string::npos)
      << error;
  // A new shape traces another graph; a new dtype is refused, named.
  step({{"x", randn({3, 8}, 2)}});
  EXPECT_EQ(step.traced_graphs(), 2u);
  error = ErrorOf([&] { step({{"x", fn::cast(randn({5, 8}, 1), DType::kBFloat16)}}); });
  EXPECT_NE(error.find("graph 'step': input 'x' is bf16 now; the graph was traced with f32 for it"),
            std::string::npos)
      << error;
  EXPECT_EQ(step.traced_graphs(), 2u);
}

TEST(GraphStep, AGraphBuiltForAnotherWorldCompilesAndRefusesToRun) {
  // Built as rank 3 of 4 on this one process: parameters without storage.
  std::unique_ptr<Graph> step;
  const ir::Graph* graph = nullptr;
  Tensor w_local;
  {
    MetaScope meta(4, 3);
    EXPECT_EQ(CurrentWorldSize(), 4);
    EXPECT_EQ(CurrentRank(), 3);
    const Placement p(DeviceType::kCPU, {0, 1, 2, 3}, {4});
    Tensor w = randn({8, 4}, p, NdSbp{S(1)}, 7);
    EXPECT_TRUE(w.is_lazy());
    const Tensor y = fn::mul_scalar(w, 2.0);  // ops give their results' specs and run nothing
    EXPECT_TRUE(y.is_lazy());
    EXPECT_EQ(ir::Value::SpecOf(y).SpecString(), "f32 [8, 4] [S(1)] on cpu:[0, 1, 2, 3]");
    w_local = MakeMetaLocal({8, 4}, DType::kFloat32);
    step = std::make_unique<Graph>("planned", [&](const Graph::Tensors& in) -> Graph::Tensors {
      return {{"y", fn::matmul(in.at("x"), w_local)}};
    });
    graph = &step->Trace({{"x", MakeMetaLocal({2, 8}, DType::kFloat32)}});
  }
  EXPECT_EQ(CurrentWorldSize(), 1);  // the scope is gone
  int variables = 0;
  for (const ir::Value& v : graph->values()) variables += v.kind == ir::Value::Kind::kVariable;
  EXPECT_EQ(variables, 1);  // the weight, with no data
  const std::string error = ErrorOf([&] {
    RunInOrder(*graph, {{"x", Tensor::FromVector<float>(std::vector<float>(16, 1.0f), {2, 8})}});
  });
  EXPECT_NE(error.find("has no data: the graph was built for planning"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel
