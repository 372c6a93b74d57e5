// The actor runtime's communication on 4 ranks (2 pipeline stages of 2
// tensor-parallel ranks), with delays injected on one stage: a pipeline
// receive is posted and completes on its own queue, so a tensor-parallel
// all-reduce the schedule orders after it does not wait for a slow stage;
// receives from both neighbouring stages complete in whichever order they
// arrive; the values are eager's.
//   tessel-launch --nproc_per_node 4 -- actor_comm_test --check_lockstep=false
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "graph/autograd.h"
#include "graph/plan/graph.h"
#include "ops/functional.h"
#include "runtime/actor_runtime.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

// A copy of x that takes `ms` milliseconds on ranks listed in `slow_ranks`
// (a stage made slow on purpose).
void RegisterSlowCopy() {
  static const bool registered = [] {
    OpDef def;
    def.name = "test_slow_copy";
    def.inputs = {"x"};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) { return in; };
    def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
      for (int64_t r : ctx.attrs.Get<std::vector<int64_t>>("slow_ranks"))
        if (r == CurrentRank())
          std::this_thread::sleep_for(std::chrono::milliseconds(ctx.attrs.Get<int64_t>("ms")));
      return std::vector<Tensor>{ctx.inputs[0].Clone()};
    };
    def.not_differentiable = true;
    RegisterOp(std::move(def));
    return true;
  }();
  (void)registered;
}

Placement Stage0() { return Placement(DeviceType::kCPU, {0, 1}); }
Placement Stage1() { return Placement(DeviceType::kCPU, {2, 3}); }
constexpr int64_t kDelayMs = 600;

// Stage 0 computes h = slow(x) and hands it to stage 1; stage 1, meanwhile,
// computes z = a @ w with the contraction split over its two ranks (a
// partial sum, all-reduced to B) and returns h + z. The trace records the
// stage transfer before the all-reduce, so both sit in that order on
// stage 1's communication stream.
Graph::Tensors Build(const Graph::Tensors& in) {
  Tensor h1;
  {
    LayerScope layer(0);
    Tensor h = ApplyOp("test_slow_copy", {in.at("x")},
                       {{"ms", kDelayMs}, {"slow_ranks", std::vector<int64_t>{0, 1}}})
                   .at(0);
    h1 = h.to_global(Stage1(), {B()});
  }
  LayerScope layer(1);
  Tensor z = fn::matmul(in.at("a"), in.at("w")).to_global(Stage1(), {B()});
  return {{"out", fn::add(h1, z)}};
}

GraphOptions Pipeline() { return GraphOptions{.stage_ranks = {{0, 1}, {2, 3}}, .layer_stages = {0, 1}}; }

Graph::Tensors Inputs() {
  return {{"x", randn({4, 6}, Stage0(), {B()}, 1)},
          {"a", randn({4, 8}, Stage1(), {S(1)}, 2)},
          {"w", randn({8, 6}, Stage1(), {S(0)}, 3)}};
}

TEST(ActorCommunication, APendingReceiveDoesNotDelayATensorParallelAllReduce) {
  ASSERT_EQ(CurrentWorldSize(), 4);
  RegisterSlowCopy();
  runtime::ActorRuntime actors;
  GraphOptions options = Pipeline();
  options.executor = actors.Executor();
  Graph step("slow_stage", Build, options);
  const Graph::Tensors inputs = Inputs();
  const Tensor want = fn::add(randn({4, 6}, 1), fn::matmul(randn({4, 8}, 2), randn({8, 6}, 3)));
  for (int i = 0; i < 2; ++i) {
    const Tensor out = step(inputs).at("out");
    if (CurrentRank() < 2) continue;  // the result lives on stage 1
    const std::vector<float> got = out.to_local().ToVector<float>(), w = want.ToVector<float>();
    ASSERT_EQ(got.size(), w.size());
    for (size_t k = 0; k < w.size(); ++k) EXPECT_NEAR(got[k], w[k], 1e-4f) << k;
  }
  if (CurrentRank() < 2) return;
  const ir::Graph& graph = step.Trace(inputs);
  const runtime::StepReport& r = actors.last_step();
  int64_t receive_start = -1, receive_end = -1, all_reduce_end = -1;
  for (const runtime::ActorEvent& e : r.events) {
    const ir::Op& op = graph.ops().at(static_cast<size_t>(e.op));
    if (op.name == "recv") receive_start = e.start_us, receive_end = e.end_us;
    if (op.name == "to_global" && op.stage == 1) all_reduce_end = e.end_us;
  }
  ASSERT_GE(receive_end, 0) << "no receive on stage 1";
  ASSERT_GE(all_reduce_end, 0) << "no all-reduce on stage 1";
  // The receive waited for the slow stage; the all-reduce did not wait for it.
  EXPECT_GE(receive_end - receive_start, (kDelayMs / 2) * 1000) << "stage 0 was not slow";
  EXPECT_LT(all_reduce_end, receive_end) << "the all-reduce waited for the receive";
  EXPECT_LT(all_reduce_end - r.start_us, (kDelayMs / 2) * 1000);
}

TEST(ActorCommunication, ATrainingStepWithASlowStageGivesEagersGradients) {
  // Forward activations go to stage 1, their gradients come back to stage
  // 0, over 2 micro-batches under 1F1B, with stage 0's forward slowed: the
  // gradients are eager's.
  ASSERT_EQ(CurrentWorldSize(), 4);
  RegisterSlowCopy();
  Tensor w0 = randn({6, 8}, Stage0(), {S(1)}, 5).set_requires_grad(true);
  Tensor w1 = randn({8, 3}, Stage1(), {S(0)}, 6).set_requires_grad(true);
  runtime::ActorRuntime actors;
  GraphOptions options{.micro_batches = 2, .stage_ranks = {{0, 1}, {2, 3}}, .layer_stages = {0, 1}};
  options.executor = actors.Executor();
  Graph step(
      "slow_training",
      [&](const Graph::Tensors& in) -> Graph::Tensors {
        Tensor h;
        {
          LayerScope layer(0);
          Tensor x = ApplyOp("test_slow_copy", {in.at("x")},
                             {{"ms", kDelayMs / 4}, {"slow_ranks", std::vector<int64_t>{0, 1}}})
                         .at(0);
          h = fn::matmul(x, w0).to_global(Stage1(), {S(1)});
        }
        LayerScope layer(1);
        Tensor loss = fn::mean(fn::mul(fn::matmul(h, w1), fn::matmul(h, w1)), {});
        loss.backward();
        return {{"loss", loss}, {"g0", w0.grad()}, {"g1", w1.grad()}};
      },
      options);
  const Graph::Tensors inputs = {{"x", randn({4, 6}, Stage0(), {B()}, 4)}};
  // Eager on whole local tensors: the mean over each micro-batch's loss.
  Tensor lw0 = randn({6, 8}, 5).set_requires_grad(true), lw1 = randn({8, 3}, 6).set_requires_grad(true);
  const Tensor lx = randn({4, 6}, 4);
  Tensor y = fn::matmul(fn::matmul(lx, lw0), lw1);
  fn::mean(fn::mul(y, y), {}).backward();
  for (int i = 0; i < 2; ++i) {
    Graph::Tensors out = step(inputs);
    for (const auto& [name, want] : {std::pair<std::string, Tensor>{"g0", lw0.grad()}, {"g1", lw1.grad()}}) {
      const Tensor& got = out.at(name);
      const Tensor whole = got.to_global(got.placement(), NdSbp({B()}));  // every rank takes part
      if (!got.placement().Contains(CurrentRank())) continue;
      const std::vector<float> g = whole.to_local().ToVector<float>(), w = want.ToVector<float>();
      ASSERT_EQ(g.size(), w.size()) << name;
      for (size_t k = 0; k < w.size(); ++k)
        EXPECT_NEAR(g[k], w[k], 1e-4f * (1 + std::abs(w[k]))) << name << k;
    }
  }
  EXPECT_EQ(actors.last_step().micro_batches, 2);
}

}  // namespace
}  // namespace tessel
