// The actor runtime (runtime/actor_runtime.h) on one process: a training
// step with gradient accumulation gives the in-order executor's values bit
// for bit under both schedules, its trace is the schedule's order, its
// timeline names every actor and unit, and bad settings are refused.
#include "runtime/actor_runtime.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/init.h"
#include "graph/plan/graph.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"
#include "tests/testing/tiny_mlp.h"

namespace tessel::runtime {
namespace {

using testing::ErrorOf;

using Mlp = testing::TinyMlp;

// Three accumulated steps of the MLP: the losses, the trained w1 and, run
// by actors, the last step's timeline.
struct Trained {
  std::vector<float> losses, w1;
  std::string timeline;
};
Trained Train(ActorRuntime* actors) {
  Mlp m;
  optim::AdamW adamw(m.params(), {.lr = 0.05});
  GraphOptions options{.micro_batches = 4};
  if (actors != nullptr) options.executor = actors->Executor();
  Graph step(
      "mlp_step",
      [&](const Graph::Tensors& in) -> Graph::Tensors {
        Tensor loss = m.Loss(in.at("x"));
        loss.backward();
        optim::ClipGradNormTensor(m.params(), 1.0);
        adamw.Step();
        return {{"loss", loss}};
      },
      options);
  Trained out;
  for (int i = 0; i < 3; ++i)
    out.losses.push_back(step({{"x", randn({8, 8}, 100 + i)}}).at("loss").ToVector<float>()[0]);
  out.w1 = m.w1.ToVector<float>();
  if (actors != nullptr) out.timeline = actors->TimelineJson(step.Trace({{"x", randn({8, 8}, 100)}}));
  return out;
}

TEST(ActorRuntime, AccumulatedStepsEqualTheInOrderExecutorsUnderBothSchedules) {
  const Trained want = Train(nullptr);
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    ActorRuntime actors({.schedule = schedule});
    const Trained got = Train(&actors);
    EXPECT_EQ(got.losses, want.losses) << schedule;
    EXPECT_EQ(got.w1, want.w1) << schedule;
    const StepReport& r = actors.last_step();
    EXPECT_EQ(r.stages, 1);
    EXPECT_EQ(r.micro_batches, 4);
    // One stage: 1F1B has no warm-up; GPipe still runs every forward first.
    EXPECT_EQ(ActionsText(r.actions), ActionsText(StageActions(schedule, 1, 0, 4))) << schedule;
    EXPECT_EQ(ValidateActions(r.actions, 4), "");
    EXPECT_EQ(r.max_in_flight, schedule == "gpipe" ? 4 : 1);
    EXPECT_GT(r.peak_bytes, 0);
    bool communicated = false, computed = false;
    for (const ActorEvent& e : r.events) {
      EXPECT_LE(r.start_us, e.start_us);
      EXPECT_LE(e.start_us, e.end_us);
      EXPECT_LE(e.end_us, r.end_us);
      communicated |= e.stream == Stream::kCommunication;
      computed |= e.stream == Stream::kCompute;
    }
    EXPECT_TRUE(computed);
    EXPECT_FALSE(communicated);  // one process: nothing to exchange
  }
}

TEST(ActorRuntime, TheTimelineNamesActorsUnitsAndTheStep) {
  ActorRuntime actors;
  const std::string json = Train(&actors).timeline;
  EXPECT_EQ(json.substr(0, 2), "{\"");
  EXPECT_EQ(json.substr(json.size() - 3), "]}\n");
  for (const char* want :
       {"\"name\":\"matmul\"", "\"name\":\"F0\"", "\"name\":\"B3\"", "\"name\":\"compute\"",
        "\"schedule\":\"1f1b\"", "\"micro_batches\":4", "\"cat\":\"backward\""})
    EXPECT_NE(json.find(want), std::string::npos) << want;
}

TEST(ActorRuntime, BadInputsAreRefusedBeforeAnyActorRuns) {
  ActorRuntime actors;
  Mlp m;
  Graph step("mlp_loss",
             [&](const Graph::Tensors& in) -> Graph::Tensors {
               return {{"loss", m.Loss(in.at("x"))}};
             },
             {.executor = actors.Executor()});
  const ir::Graph& graph = step.Trace({{"x", randn({4, 8}, 3)}});
  EXPECT_NE(ErrorOf([&] {
              actors.Run(graph, {{"x", randn({4, 8}, 3)}, {"y", randn({4, 8}, 3)}});
            }).find("'y'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              actors.Run(graph, {{"x", randn({5, 8}, 3)}});
            }).find("traced with"),
            std::string::npos);
  const std::string quota = ErrorOf([] { ActorRuntime bad({.max_pending_sends = -2}); });
  EXPECT_NE(quota.find("max_pending_sends -2"), std::string::npos) << quota;
  // One process has no stage transfers: no quota to keep.
  actors.Run(graph, {{"x", randn({4, 8}, 3)}});
  EXPECT_EQ(actors.last_step().send_quota, 0);
}

TEST(ActorRuntime, AFailingActorStopsTheStepNamingItsOpMicroBatchAndPass) {
  ir::Graph graph("broken");
  ir::Value spec;
  spec.shape = Shape({4, 8});
  const int x = graph.AddInput("x", spec);
  const int y = graph.AddOp("tanh", {}, {x}, {spec})[0];
  ir::Value five;
  five.shape = Shape({5});
  // Recorded with a shape the kernel refuses: the op fails when it runs.
  const int z = graph.AddOp("reshape", Attrs{{"shape", std::vector<int64_t>{5}}}, {y}, {five})[0];
  graph.mutable_op(1).micro_batch = 0;
  graph.mutable_op(1).backward = true;
  graph.MarkOutput("z", z);
  ActorRuntime actors;
  const std::string error = ErrorOf([&] { actors.Run(graph, {{"x", randn({4, 8}, 3)}}); });
  EXPECT_NE(error.find("graph 'broken': op 1 'reshape' (stage -1, micro-batch 0, backward) on rank 0 failed"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("reshape of [4, 8]"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel::runtime
