// The small GPT's loss and every parameter gradient, traced into a graph on
// each rank and run by the in-order executor, equal eager mode's — shard
// by shard, with the same layouts — under the --dp/--tp/--pp layout.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/autograd.h"
#include "graph/ir/tracer.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/passes.h"
#include "graph/passes/step_runs.h"
#include "graph/plan/graph.h"
#include "graph/plan/in_order_executor.h"
#include "graph/plan/rank_plan.h"
#include "graph/plan/rank_plan.pb.h"
#include "layers/dist.h"
#include "layers/optimizer.h"
#include "models/gpt.h"
#include "sbp/global_tensor.h"
#include "tests/graph/small_graph.h"

DEFINE_int64(dp, 1, "data parallel size");
DEFINE_int64(tp, 1, "tensor parallel size");
DEFINE_int64(pp, 1, "pipeline parallel size");

namespace tessel {
namespace {

// The small GPT's configuration, with the --dp/--tp/--pp layout set up.
models::GPTConfig SetupLayout() {
  models::GPTConfig config;
  dist::Setup({.data_parallel_size = FLAGS_dp,
               .tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = config.layers});
  return config;
}

// Token ids and labels [rows, 16]; `step` shifts the tokens.
std::pair<Tensor, Tensor> Batch(const models::GPTConfig& config, int64_t step, int64_t rows) {
  const int64_t seq = 16;
  std::vector<int64_t> x(rows * seq), y(rows * seq);
  for (int64_t i = 0; i < rows * seq; ++i) {
    x[i] = (i * 37 + step * 11 + 5) % config.vocab_size;
    y[i] = (i * 37 + step * 11 + 42) % config.vocab_size;
  }
  return {Tensor::FromVector<int64_t>(x, {rows, seq}), Tensor::FromVector<int64_t>(y, {rows, seq})};
}

// The same layout and, where this rank holds a part, the same values
// (within tol, relative to 1 + |want|).
void ExpectSameShards(const Tensor& got, const Tensor& want, const std::string& what, double tol = 1e-5) {
  ASSERT_FALSE(got.is_lazy()) << what;
  ASSERT_EQ(got.is_global(), want.is_global()) << what;
  if (want.is_global()) {
    EXPECT_EQ(got.placement(), want.placement()) << what;
    EXPECT_EQ(got.nd_sbp(), want.nd_sbp()) << what;
    // Ranks outside the placement (other stages) hold no data of it.
    if (!want.placement().Contains(CurrentRank())) return;
  }
  std::vector<float> g = got.to_local().ToVector<float>(), w = want.to_local().ToVector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << what << "[" << i << "]";
}

TEST(GraphTrace, GptLossAndGradientsMatchEager) {
  const models::GPTConfig config = SetupLayout();
  models::GPT gpt(config);
  auto params = gpt.NamedParameters();
  const auto [ids, labels] = Batch(config, 0, 4);

  // Eager.
  Tensor eager_loss = gpt.Loss(ids, labels);
  eager_loss.backward();
  std::map<std::string, Tensor> eager_grads;
  for (auto& [name, p] : params) {
    eager_grads[name] = p->grad();
    p->zero_grad();
  }

  // Traced, then run.
  ir::Graph graph("gpt_step");
  {
    TracingInterpreter tracer(graph);
    AutogradInterpreter autograd(tracer);
    InterpreterScope scope(autograd);
    for (auto& [name, p] : params) tracer.AddVariable(name, *p);
    Tensor loss = gpt.Loss(tracer.Input("ids", ids), tracer.Input("labels", labels));
    loss.backward();
    graph.MarkOutput("loss", tracer.ValueOf(loss, "loss"));
    for (auto& [name, p] : params) {
      if (p->grad().defined()) graph.MarkOutput("grad/" + name, tracer.ValueOf(p->grad(), name));
      p->zero_grad();
    }
  }
  std::map<std::string, Tensor> out = RunInOrder(graph, {{"ids", ids}, {"labels", labels}});

  ExpectSameShards(out.at("loss"), eager_loss, "loss");
  int compared = 0;
  for (auto& [name, want] : eager_grads) {
    if (!want.defined()) continue;
    ASSERT_TRUE(out.count("grad/" + name)) << name << " has an eager gradient and no traced one";
    ExpectSameShards(out.at("grad/" + name), want, "gradient of " + name);
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(params.size()));

  // Boxing made explicit: exactly one to_global per (value, layout) an op
  // reads that differs from the value's own, none that changes nothing;
  // the graph gives the same results (the same conversions run, now as ops).
  ir::Graph boxed = graph;
  const auto implicit = testing::ImplicitBoxings(graph);
  std::vector<testing::LayoutChange> want;
  for (const testing::LayoutChange& c : testing::LayoutChanges(graph))
    if (c.changes) want.push_back(c);  // the trace's to_globals that change nothing go
  for (const auto& [value, to] : implicit) want.push_back({value, to, true});
  passes::InsertBoxing(boxed);
  ir::Verify(boxed, /*explicit_boxing=*/true);
  std::vector<testing::LayoutChange> got = testing::LayoutChanges(boxed);
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  std::map<std::string, Tensor> boxed_out = RunInOrder(boxed, {{"ids", ids}, {"labels", labels}});
  for (const auto& [name, t] : out) ExpectSameShards(boxed_out.at(name), t, "explicitly boxed " + name);
  std::printf(
      "graph of %zu ops (%zu implicit layout changes made ops) matches eager under dp=%ld tp=%ld pp=%ld\n",
      graph.ops().size(), implicit.size(), static_cast<long>(FLAGS_dp), static_cast<long>(FLAGS_tp),
      static_cast<long>(FLAGS_pp));
}

// Whole training steps — forward, backward, clipping and AdamW with a
// changing learning rate — captured once in a Graph and run 20 times give
// eager's losses and gradient norms step by step, and leave the parameters
// (variables updated in place) equal to eager's.
TEST(GraphTrace, GptTrainStepsMatchEager) {
  const models::GPTConfig config = SetupLayout();
  models::GPT eager_gpt(config), graph_gpt(config);
  auto eager_params = eager_gpt.NamedParameters(), graph_params = graph_gpt.NamedParameters();
  const optim::AdamWConfig adamw_config{.lr = 3e-3, .weight_decay = 0.1};
  optim::AdamW eager_adamw(eager_params, adamw_config), graph_adamw(graph_params, adamw_config);
  const double max_norm = 0.5;  // small enough that every step clips

  const int64_t batch = 4, steps = 20;
  Graph train_step("gpt_train_step",
                   [&](const Graph::Tensors& in) -> Graph::Tensors {
                     Tensor loss = graph_gpt.Loss(in.at("ids"), in.at("labels"));
                     loss.backward();
                     Tensor norm = optim::ClipGradNormTensor(graph_params, max_norm);
                     graph_adamw.Step();
                     return {{"loss", loss}, {"grad_norm", norm}};
                   },
                   {.stage_ranks = dist::StageRanks(), .layer_stages = dist::LayerStages()});
  for (int64_t step = 0; step < steps; ++step) {
    const double lr = 3e-3 * (1.0 - 0.04 * static_cast<double>(step));
    auto [ids, labels] = Batch(config, step, batch);
    eager_adamw.set_lr(lr);
    Tensor eager_loss = eager_gpt.Loss(ids, labels);
    eager_loss.backward();
    const double eager_norm = optim::ClipGradNorm(eager_params, max_norm);
    eager_adamw.Step();

    graph_adamw.set_lr(lr);
    Graph::Tensors out = train_step({{"ids", ids}, {"labels", labels}});
    const double loss = optim::ScalarValue(out.at("loss")), want = optim::ScalarValue(eager_loss);
    const double norm = optim::ScalarValue(out.at("grad_norm"));
    EXPECT_NEAR(loss, want, 1e-5 * (1 + std::abs(want))) << "step " << step;
    EXPECT_NEAR(norm, eager_norm, 1e-5 * (1 + eager_norm)) << "step " << step;
    EXPECT_GT(eager_norm, max_norm) << "the test means every step to clip";
    if (CurrentRank() == 0)
      std::printf("step %ld loss %.6f grad_norm %.6f\n", static_cast<long>(step), loss, norm);
  }
  EXPECT_EQ(train_step.traced_graphs(), 1u);  // traced once, run 20 times

  for (size_t i = 0; i < eager_params.size(); ++i) {
    const Tensor& got = *graph_params[i].second;
    EXPECT_FALSE(got.grad().defined()) << graph_params[i].first << " kept a gradient after the step";
    ExpectSameShards(got, *eager_params[i].second, graph_params[i].first);
  }

  // This rank's plan of the compiled step: only ops on placements that hold
  // it (layout changes: on either side; sends: on their source), all on
  // this rank's pipeline stage, the same bytes on every compile.
  auto [ids0, labels0] = Batch(config, 0, batch);
  const ir::Graph& compiled = train_step.Trace({{"ids", ids0}, {"labels", labels0}});
  std::string first;
  for (int i = 0; i < 3; ++i) {
    proto::RankPlanProto plan;
    CompileRankPlan(compiled, CurrentRank(), &plan);
    std::string bytes;
    ASSERT_TRUE(plan.SerializeToString(&bytes));
    if (i == 0) first = bytes;
    EXPECT_EQ(bytes, first) << "compile " << i;
    if (i > 0) continue;
    int own = 0;
    for (const proto::PlanOpProto& op : plan.ops()) {
      const ir::Op& logical = compiled.ops().at(op.op());
      bool holds = false;
      for (int v : logical.outputs) holds |= compiled.value(v).placement.Contains(CurrentRank());
      if (logical.name == "to_global" || logical.name == "send")
        holds |= compiled.value(logical.inputs[0]).placement.Contains(CurrentRank());
      EXPECT_TRUE(holds) << "op " << op.op() << " '" << op.name() << "' is not this rank's";
      if (op.has_stage()) {
        EXPECT_EQ(op.stage(), CurrentRank() / (FLAGS_dp * FLAGS_tp))
            << "op " << op.op() << " '" << op.name() << "'";
      }
      own += holds;
    }
    int64_t reductions = 0;
    for (const proto::CommSummaryProto& c : plan.comm_summary())
      reductions += c.kind() == "all-reduce" ? c.count() : 0;
    EXPECT_EQ(reductions > 0, FLAGS_dp > 1 || FLAGS_tp > 1) << RankPlanText(plan);
    EXPECT_EQ(own, plan.ops_size());
    if (FLAGS_pp > 1) {
      EXPECT_LT(plan.ops_size(), static_cast<int>(compiled.ops().size()));
    }
    if (CurrentRank() == 0)
      std::printf("rank 0's plan: %d of %zu ops\n", plan.ops_size(), compiled.ops().size());
  }

  // Another batch size traces another graph; the first is reused as is.
  auto [small_ids, small_labels] = Batch(config, steps, 2);
  train_step({{"ids", small_ids}, {"labels", small_labels}});
  EXPECT_EQ(train_step.traced_graphs(), 2u);
}

// Four micro-batches of gradient accumulation in graph mode equal eager
// steps on the whole (4x) batch: losses, gradient norms and the trained
// parameters, under the --dp/--tp/--pp layout.
TEST(GraphTrace, GptGradientAccumulationMatchesTheWholeBatch) {
  const models::GPTConfig config = SetupLayout();
  models::GPT eager_gpt(config), graph_gpt(config);
  auto eager_params = eager_gpt.NamedParameters(), graph_params = graph_gpt.NamedParameters();
  const optim::AdamWConfig adamw_config{.lr = 3e-3, .weight_decay = 0.1};
  optim::AdamW eager_adamw(eager_params, adamw_config), graph_adamw(graph_params, adamw_config);
  const int64_t micro_batches = 4, micro_batch_rows = 2, steps = 3;
  Graph train_step("gpt_accumulated_step",
                   [&](const Graph::Tensors& in) -> Graph::Tensors {
                     Tensor loss = graph_gpt.Loss(in.at("ids"), in.at("labels"));
                     loss.backward();
                     Tensor norm = optim::ClipGradNormTensor(graph_params, 1.0);
                     graph_adamw.Step();
                     return {{"loss", loss}, {"grad_norm", norm}};
                   },
                   {.micro_batches = static_cast<int>(micro_batches),
                    .stage_ranks = dist::StageRanks(),
                    .layer_stages = dist::LayerStages()});
  for (int64_t step = 0; step < steps; ++step) {
    auto [ids, labels] = Batch(config, step, micro_batches * micro_batch_rows);
    Tensor eager_loss = eager_gpt.Loss(ids, labels);
    eager_loss.backward();
    const double eager_norm = optim::ClipGradNorm(eager_params, 1.0);
    eager_adamw.Step();
    Graph::Tensors out = train_step({{"ids", ids}, {"labels", labels}});
    const double loss = optim::ScalarValue(out.at("loss")), want = optim::ScalarValue(eager_loss);
    const double norm = optim::ScalarValue(out.at("grad_norm"));
    EXPECT_NEAR(loss, want, 1e-5 * (1 + std::abs(want))) << "step " << step;
    EXPECT_NEAR(norm, eager_norm, 1e-5 * (1 + eager_norm)) << "step " << step;
    if (CurrentRank() == 0)
      std::printf("accumulated step %ld loss %.6f grad_norm %.6f\n", static_cast<long>(step), loss, norm);
  }
  // The gradients differ from eager's in summation order only (a mean of
  // micro-batch means), but AdamW divides by the root of the second moment:
  // where an element's gradient is near zero, that rounding reaches its
  // update almost unscaled. 5e-5 is 2% of one step's largest update.
  for (size_t i = 0; i < eager_params.size(); ++i)
    ExpectSameShards(*graph_params[i].second, *eager_params[i].second, graph_params[i].first, 5e-5);
  // Forward and backward ran once per micro-batch, the update once.
  auto [ids, labels] = Batch(config, 0, micro_batches * micro_batch_rows);
  const ir::Graph& compiled = train_step.Trace({{"ids", ids}, {"labels", labels}});
  // (Compiled once as micro-batch units, each run once per micro-batch.)
  EXPECT_EQ(compiled.micro_batch_units(), micro_batches);
  const passes::StepRuns runs(compiled);
  std::vector<int> per_micro_batch(micro_batches, 0);
  for (const passes::OpRun& r : runs.ProgramOrder())
    if (r.micro_batch >= 0) ++per_micro_batch.at(static_cast<size_t>(r.micro_batch));
  int updates = 0, step_buckets = 0;
  for (const ir::Op& op : compiled.ops()) {
    updates += op.name == "adamw_update" && op.micro_batch < 0;
    // Data-parallel gradient reductions run once per step, on the averages
    // (buckets inside a micro-batch fuse its own independent reductions).
    if (op.name == "all_reduce_bucket" && op.micro_batch < 0) {
      EXPECT_TRUE(op.backward) << "op " << op.id;
      ++step_buckets;
    }
  }
  EXPECT_EQ(updates, static_cast<int>(graph_params.size()));
  EXPECT_EQ(step_buckets > 0, FLAGS_dp > 1);
  // The tied embedding's gradient from the output layer crosses the
  // pipeline once per step (averaged on the last stage first), not once
  // per micro-batch; its weight crosses once the other way.
  if (FLAGS_pp > 1) {
    Shape table;
    for (const auto& [name, p] : graph_params)
      if (name.find("wte") != std::string::npos) table = p->shape();
    ASSERT_GT(table.ndim(), 0) << "no wte parameter";
    int weight_moves = 0, gradient_moves = 0;
    for (const ir::Op& op : compiled.ops()) {
      if (op.name != "send" || compiled.value(op.inputs[0]).shape != table) continue;
      EXPECT_LT(op.micro_batch, 0) << "op " << op.id << " sends the embedding table in a micro-batch";
      ++(op.backward ? gradient_moves : weight_moves);
    }
    EXPECT_EQ(weight_moves, 1);
    EXPECT_EQ(gradient_moves, 1);
  }
  EXPECT_GT(per_micro_batch[0], 100);
  EXPECT_EQ(per_micro_batch[1], per_micro_batch[3]);
  EXPECT_EQ(per_micro_batch[0], per_micro_batch[1]);
  // The rank's plan lists each unit once, with the runs a step makes of it.
  proto::RankPlanProto plan;
  CompileRankPlan(compiled, CurrentRank(), &plan);
  int planned_units = 0;
  for (const proto::PlanOpProto& op : plan.ops()) {
    EXPECT_TRUE(op.runs() == 1 || op.runs() == micro_batches) << op.name();
    planned_units += op.runs() == micro_batches;
  }
  EXPECT_GT(planned_units, 0);
}

// Activation checkpointing on a 12-layer GPT: recomputing every layer in
// backward gives the same losses and parameters (the same ops on the same
// values, so bit for bit), and the activations alive at once on this rank
// fall by at least 40%. The planner's peak of all op results is within 10%
// of the peak the allocator measures while the step runs, with and without
// checkpointing.
TEST(GraphTrace, GptActivationCheckpointingKeepsTheLossesAndCutsThePeak) {
  models::GPTConfig config;
  config.layers = 12;
  dist::Setup({.data_parallel_size = FLAGS_dp,
               .tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = config.layers});
  models::GPTConfig checkpointed_config = config;
  checkpointed_config.activation_checkpoint = true;
  models::GPT plain_gpt(config), checkpointed_gpt(checkpointed_config);
  optim::NamedParams plain_params = plain_gpt.NamedParameters(),
                     checkpointed_params = checkpointed_gpt.NamedParameters();
  optim::AdamW plain_adamw(plain_params, {.lr = 3e-3}), checkpointed_adamw(checkpointed_params, {.lr = 3e-3});
  auto train_step = [](models::GPT& gpt, optim::AdamW& adamw) {
    return [&gpt, &adamw](const Graph::Tensors& in) -> Graph::Tensors {
      Tensor loss = gpt.Loss(in.at("ids"), in.at("labels"));
      loss.backward();
      adamw.Step();
      return {{"loss", loss}};
    };
  };
  Graph plain_step("plain", train_step(plain_gpt, plain_adamw)),
      checkpointed_step("checkpointed", train_step(checkpointed_gpt, checkpointed_adamw));
  Graph* steps[2] = {&plain_step, &checkpointed_step};
  int64_t planned[2] = {0, 0}, activations[2] = {0, 0}, measured[2] = {0, 0};
  for (int64_t step = 0; step < 3; ++step) {
    auto [ids, labels] = Batch(config, step, 4);
    const Graph::Tensors inputs = {{"ids", ids}, {"labels", labels}};
    double losses[2];
    for (int k = 0; k < 2; ++k) {
      const ir::Graph& compiled = steps[k]->Trace(inputs);
      const passes::MemoryPlan plan = passes::PlanMemory(compiled, CurrentRank());
      planned[k] = plan.peak_bytes;
      activations[k] = plan.peak_activation_bytes;
      RunStats stats;
      losses[k] = optim::ScalarValue(RunInOrder(compiled, inputs, &stats).at("loss"));
      measured[k] = std::max(measured[k], stats.peak_bytes);
    }
    EXPECT_EQ(losses[0], losses[1]) << "step " << step;
  }
  for (size_t i = 0; i < plain_params.size(); ++i)
    ExpectSameShards(*checkpointed_params[i].second, *plain_params[i].second, plain_params[i].first, 0.0);

  auto [ids0, labels0] = Batch(config, 0, 4);
  int recomputed = 0;
  for (const ir::Op& op : checkpointed_step.Trace({{"ids", ids0}, {"labels", labels0}}).ops())
    recomputed += op.backward && op.recompute_region >= 0;
  EXPECT_GT(recomputed, 0);
  std::printf(
      "rank %d: activations alive at once %lld -> %lld bytes with checkpointing (%.0f%% less); peak of all "
      "op "
      "results planned %lld -> %lld, measured %lld -> %lld\n",
      CurrentRank(), static_cast<long long>(activations[0]), static_cast<long long>(activations[1]),
      100.0 * (1.0 - static_cast<double>(activations[1]) / static_cast<double>(activations[0])),
      static_cast<long long>(planned[0]), static_cast<long long>(planned[1]),
      static_cast<long long>(measured[0]), static_cast<long long>(measured[1]));
  EXPECT_LE(static_cast<double>(activations[1]), 0.6 * static_cast<double>(activations[0]));
  for (int k = 0; k < 2; ++k) {
    EXPECT_NEAR(static_cast<double>(measured[k]), static_cast<double>(planned[k]),
                0.1 * static_cast<double>(planned[k]))
        << (k ? "with" : "without") << " checkpointing";
  }
}

}  // namespace
}  // namespace tessel
