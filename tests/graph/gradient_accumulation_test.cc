// Gradient accumulation (graph/passes/gradient_accumulation.cc): a step
// traced with GraphOptions::micro_batches runs forward and backward once per
// micro-batch and the update once, and equals eager mode's step on the
// whole batch; the rewrite is visible in the IR; what it cannot mean is
// refused by name. Also the micro_batch op it cuts inputs with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.pb.h"
#include "graph/passes/passes.h"
#include "graph/passes/step_runs.h"
#include "graph/plan/graph.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

using testing::ErrorOf;

struct Regression {
  Tensor w1 = randn({8, 16}, 1).set_requires_grad(true);
  Tensor w2 = randn({16, 3}, 2).set_requires_grad(true);
  optim::NamedParams params() { return {{"w1", &w1}, {"w2", &w2}}; }
  // Mean squared error over rows and outputs.
  Tensor Loss(const Tensor& x, const Tensor& target) const {
    Tensor err = fn::sub(fn::matmul(fn::tanh(fn::matmul(x, w1)), w2), target);
    return fn::mean(fn::mul(err, err), {0, 1});
  }
};

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}

TEST(MicroBatch, TakesTheIndexedChunkOfEveryBlock) {
  std::vector<float> rows;
  for (int r = 0; r < 8; ++r) rows.insert(rows.end(), {static_cast<float>(r), 10.0f + r});
  const Tensor x = Tensor::FromVector<float>(rows, {8, 2});
  // Two blocks of four rows, two micro-batches: micro-batch 1 holds rows 2, 3 and 6, 7.
  Tensor mb =
      ApplyOp("micro_batch", {x}, {{"index", int64_t{1}}, {"count", int64_t{2}}, {"blocks", int64_t{2}}})[0];
  EXPECT_EQ(mb.shape(), Shape({4, 2}));
  EXPECT_EQ(mb.ToVector<float>(), (std::vector<float>{2, 12, 3, 13, 6, 16, 7, 17}));
  // One block: plain consecutive chunks.
  mb = ApplyOp("micro_batch", {x}, {{"index", int64_t{3}}, {"count", int64_t{4}}, {"blocks", int64_t{1}}})[0];
  EXPECT_EQ(mb.ToVector<float>(), (std::vector<float>{6, 16, 7, 17}));
  const std::string error = ErrorOf([&] {
    ApplyOp("micro_batch", {x}, {{"index", int64_t{0}}, {"count", int64_t{3}}, {"blocks", int64_t{1}}});
  });
  EXPECT_NE(error.find("a batch of 8 rows in 1 block(s) cannot be cut into 3 micro-batches"),
            std::string::npos)
      << error;
}

TEST(GradientAccumulation, FourMicroBatchesEqualOneStepOnTheWholeBatch) {
  Regression eager, captured;
  optim::AdamW eager_adamw(eager.params(), {.lr = 0.05}), graph_adamw(captured.params(), {.lr = 0.05});
  Graph step("accumulated_step",
             [&](const Graph::Tensors& in) -> Graph::Tensors {
               Tensor loss = captured.Loss(in.at("x"), in.at("target"));
               loss.backward();
               Tensor norm = optim::ClipGradNormTensor(captured.params(), 0.5);
               graph_adamw.Step();
               return {{"loss", loss}, {"grad_norm", norm}};
             },
             {.micro_batches = 4});
  for (int i = 0; i < 4; ++i) {
    const Tensor x = randn({8, 8}, 100 + i), target = randn({8, 3}, 200 + i);
    Tensor loss = eager.Loss(x, target);
    loss.backward();
    const double norm = optim::ClipGradNorm(eager.params(), 0.5);
    eager_adamw.Step();
    Graph::Tensors out = step({{"x", x}, {"target", target}});
    const float want = loss.ToVector<float>()[0];
    EXPECT_NEAR(out.at("loss").ToVector<float>()[0], want, 1e-6 * (1 + std::abs(want))) << "step " << i;
    EXPECT_NEAR(out.at("grad_norm").ToVector<float>()[0], norm, 1e-5 * (1 + norm)) << "step " << i;
    EXPECT_GT(norm, 0.5) << "the test means every step to clip";
  }
  ExpectClose(captured.w1.ToVector<float>(), eager.w1.ToVector<float>(), 1e-5, "w1");
  ExpectClose(captured.w2.ToVector<float>(), eager.w2.ToVector<float>(), 1e-5, "w2");

  // The rewrite in the IR: each input cut four ways; forward and backward,
  // traced on a micro-batch, left once as units a step runs once per
  // micro-batch; each gradient and the loss summed over the micro-batches
  // and scaled once; clipping and AdamW once.
  const ir::Graph& graph = step.Trace({{"x", randn({8, 8}, 1)}, {"target", randn({8, 3}, 2)}});
  EXPECT_EQ(graph.micro_batch_units(), 4);
  const passes::StepRuns runs(graph);
  int unit_ops = 0, cuts = 0, sums = 0, updates = 0, averages = 0, once = 0;
  for (const ir::Op& op : graph.ops()) {
    if (runs.unit(op.id))
      ++unit_ops;
    else
      ++once;
    cuts += op.name == "micro_batch";
    sums += op.name == "micro_batch_sum";
    updates += op.name == "adamw_update";
    if (op.name == "mul_scalar" && op.attrs.Get<double>("scalar") == 0.25) ++averages;
    if (op.name == "micro_batch") {
      EXPECT_EQ(graph.value(op.outputs[0]).shape[0], 2);
      EXPECT_EQ(op.micro_batch, 0);
    }
  }
  EXPECT_EQ(cuts, 2);
  EXPECT_EQ(sums, 3);  // two gradients and the loss
  EXPECT_EQ(updates, 2);
  EXPECT_EQ(graph.gradients().size(), 2u);
  EXPECT_EQ(averages, 3);
  EXPECT_GT(unit_ops, 10);
  EXPECT_GT(once, updates);
  // What runs: the units four times, in micro-batch order, the rest once.
  const std::vector<passes::OpRun> order = runs.ProgramOrder();
  EXPECT_EQ(order.size(), static_cast<size_t>(once + 4 * unit_ops));
  std::vector<int> per_micro_batch(4, 0);
  for (const passes::OpRun& r : order)
    if (r.micro_batch >= 0) ++per_micro_batch.at(static_cast<size_t>(r.micro_batch));
  EXPECT_EQ(per_micro_batch, std::vector<int>(4, unit_ops));
  proto::GraphProto serialised;
  graph.ToProto(&serialised);
  EXPECT_EQ(serialised.gradients_size(), 2);
  EXPECT_EQ(serialised.micro_batch_units(), 4);
  const std::string text = graph.ToText();
  EXPECT_NE(text.find("[each of 4 micro-batches]"), std::string::npos) << text;
  for (int g : graph.gradients()) EXPECT_NE(text.find("gradient %" + std::to_string(g)), std::string::npos);
}

// The compiler works on one micro-batch's ops (the units), whatever the
// count: the graph boxing insertion gets is the same size for 2 and 8
// micro-batches, sums its shares with micro_batch_sum ops, and prints its
// units as each micro-batch's; a step runs the units 2 and 8 times.
TEST(GradientAccumulation, ThePassesAfterItSeeOneMicroBatchsUnits) {
  const std::string dir = ::testing::TempDir() + "tessel_units_" + std::to_string(::getpid());
  ::setenv("TESSEL_DEBUG_PASS", "boxing_insertion", 1);
  ::setenv("TESSEL_DEBUG_PASS_DIR", dir.c_str(), 1);
  std::vector<std::string> before_boxing;
  std::vector<size_t> compiled;
  for (int n : {2, 8}) {
    Regression m;
    optim::AdamW adamw(m.params(), {.lr = 0.05});
    Graph step("units" + std::to_string(n),
               [&](const Graph::Tensors& in) -> Graph::Tensors {
                 Tensor loss = m.Loss(in.at("x"), in.at("target"));
                 loss.backward();
                 adamw.Step();
                 return {{"loss", loss}};
               },
               {.micro_batches = n});
    const ir::Graph& units = step.Trace({{"x", randn({16, 8}, 1)}, {"target", randn({16, 3}, 2)}});
    EXPECT_EQ(units.micro_batch_units(), n);
    const passes::StepRuns runs(units);
    step({{"x", randn({16, 8}, 1)}, {"target", randn({16, 3}, 2)}});  // the units run
    const std::vector<passes::OpRun> order = runs.ProgramOrder();
    int last_run = 0;
    for (const passes::OpRun& r : order) last_run = std::max(last_run, r.micro_batch);
    EXPECT_EQ(last_run, n - 1);
    compiled.push_back(order.size());
    std::ifstream in(dir + "/units" + std::to_string(n) + ".rank0.04-boxing_insertion.before.txt");
    ASSERT_TRUE(in.good()) << "no dump of the graph boxing insertion got, under " << dir;
    before_boxing.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ::unsetenv("TESSEL_DEBUG_PASS");
  ::unsetenv("TESSEL_DEBUG_PASS_DIR");
  auto ops_in = [](const std::string& text) {  // op lines read "%5 = neg(%3 ..."
    size_t count = 0;
    for (size_t at = text.find("(%"); at != std::string::npos; at = text.find("(%", at + 1)) ++count;
    return count;
  };
  EXPECT_EQ(ops_in(before_boxing[0]), ops_in(before_boxing[1]));
  EXPECT_GT(compiled[1], compiled[0] + 3 * (compiled[0] / 2));  // runs per micro-batch
  for (const std::string& text : before_boxing) {
    EXPECT_NE(text.find("micro_batch_sum("), std::string::npos) << text;
    EXPECT_EQ(text.find("[micro-batch 1]"), std::string::npos) << text;
  }
  EXPECT_NE(before_boxing[1].find("[each of 8 micro-batches]"), std::string::npos) << before_boxing[1];
  std::filesystem::remove_all(dir);
}

TEST(GradientAccumulation, OneMicroBatchChangesNothing) {
  Regression m;
  optim::AdamW adamw(m.params(), {.lr = 0.05});
  Graph step("plain", [&](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor loss = m.Loss(in.at("x"), in.at("target"));
    loss.backward();
    adamw.Step();
    return {{"loss", loss}};
  });
  const ir::Graph& graph = step.Trace({{"x", randn({8, 8}, 1)}, {"target", randn({8, 3}, 2)}});
  for (const ir::Op& op : graph.ops()) {
    EXPECT_NE(op.name, "micro_batch");
    EXPECT_EQ(op.micro_batch, -1);
  }
  EXPECT_EQ(graph.gradients().size(), 2u);  // marked all the same
}

TEST(GradientAccumulation, WhatItCannotMeanIsNamed) {
  Regression m;
  optim::AdamW adamw(m.params(), {.lr = 0.05});
  auto train = [&](const Graph::Tensors& in) {
    Tensor loss = m.Loss(in.at("x"), in.at("target"));
    loss.backward();
    Tensor norm = optim::ClipGradNormTensor(m.params(), 1.0);
    adamw.Step();
    return std::make_pair(loss, norm);
  };
  const Tensor target6 = randn({6, 3}, 2);
  Graph uneven("uneven",
               [&](const Graph::Tensors& in) -> Graph::Tensors {
                 return {{"loss", train(in).first}};
               },
               {.micro_batches = 4});
  std::string error = ErrorOf([&] { uneven({{"x", randn({6, 8}, 1)}, {"target", target6}}); });
  EXPECT_NE(error.find("graph 'uneven': input 'target' (f32 [6, 3]) has 6 rows in dimension 0; 4 "
                       "micro-batches need a multiple of 4"),
            std::string::npos)
      << error;

  Graph rows("rows",
             [&](const Graph::Tensors& in) -> Graph::Tensors {
               Tensor y = fn::matmul(in.at("x"), m.w1);
               train(in);
               return {{"hidden", y}};
             },
             {.micro_batches = 2});
  error = ErrorOf([&] { rows({{"x", randn({8, 8}, 1)}, {"target", randn({8, 3}, 2)}}); });
  EXPECT_NE(error.find("result 'hidden' (f32 [4, 16] per micro-batch) is computed from the batch"),
            std::string::npos)
      << error;

  Graph mixed("mixed",
              [&](const Graph::Tensors& in) -> Graph::Tensors {
                auto [loss, norm] = train(in);
                return {{"loss_plus_norm", fn::add(loss, norm)}};
              },
              {.micro_batches = 2});
  // A forward after the update: its copies would run before the update.
  Graph again("forward_after_update",
              [&](const Graph::Tensors& in) -> Graph::Tensors {
                Tensor loss = train(in).first;
                return {{"loss", loss}, {"loss_after", m.Loss(in.at("x"), in.at("target"))}};
              },
              {.micro_batches = 2});
  error = ErrorOf([&] { again({{"x", randn({8, 8}, 1)}, {"target", randn({8, 3}, 2)}}); });
  EXPECT_NE(error.find("'adamw_update' and op "), std::string::npos) << error;
  EXPECT_NE(error.find("one updates it in place"), std::string::npos) << error;

  error = ErrorOf([&] { mixed({{"x", randn({8, 8}, 1)}, {"target", randn({8, 3}, 2)}}); });
  EXPECT_NE(error.find("'add' reads %"), std::string::npos) << error;
  EXPECT_NE(error.find("ops after backward may read the gradients or the batch's values, not both"),
            std::string::npos)
      << error;

  error = ErrorOf(
      [&] { Graph("bad", [&](const Graph::Tensors&) { return Graph::Tensors{}; }, {.micro_batches = 0}); });
  EXPECT_NE(error.find("graph 'bad': micro_batches is 0; expected 1 or more"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel
