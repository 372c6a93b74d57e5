// The executable plan (graph/plan/exec_plan.h): a compiled graph lowered
// for this rank runs its instructions as they are — each op's shapes are
// inferred when it is traced, never at a step — with kernels, boxes,
// layouts and boxing plans resolved once, and gives eager's values.
// (No world here: boxing that moves data runs in tests/dist.)
#include "graph/plan/exec_plan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "graph/plan/graph.h"
#include "ops/functional.h"
#include "tests/graph/small_graph.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

std::atomic<int> g_infer_calls{0};

// x * 3, counting how often its shapes are inferred.
void RegisterCountedTriple() {
  static const bool registered = [] {
    OpDef def;
    def.name = "test_counted_triple";
    def.inputs = {"x"};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
      ++g_infer_calls;
      return std::vector<TensorSpec>{in[0]};
    };
    def.sbp = [](const std::vector<TensorSpec>& in, const Attrs&) {
      std::vector<SbpSignature> sigs;
      for (int d = 0; d < in[0].shape.ndim(); ++d) sigs.push_back({{S(d)}, {S(d)}});
      return sigs;
    };
    def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
      return std::vector<Tensor>{fn::mul_scalar(ctx.inputs[0], 3.0)};
    };
    def.not_differentiable = true;
    RegisterOp(std::move(def));
    return true;
  }();
  (void)registered;
}

Placement Self() { return Placement(DeviceType::kCPU, {CurrentRank()}); }

TEST(ExecPlan, AStepRunsInstructionsWithoutInferringShapes) {
  RegisterCountedTriple();
  Graph step("triple", [](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor y = ApplyOp("test_counted_triple", {in.at("x")}).at(0);
    y = ApplyOp("test_counted_triple", {fn::add(y, in.at("x"))}).at(0);
    return {{"y", y}};
  });
  const Tensor x = randn({4, 6}, 3).to_global(Self(), {B()});
  Tensor want = fn::mul_scalar(fn::add(fn::mul_scalar(x, 3.0), x), 3.0);
  step({{"x", x}});  // traces, compiles, lowers and runs
  const int after_first = g_infer_calls.load();
  for (int i = 0; i < 5; ++i) {
    const Tensor y = step({{"x", x}}).at("y");
    ASSERT_TRUE(y.is_global());
    EXPECT_EQ(y.nd_sbp(), NdSbp({B()}));
    EXPECT_EQ(y.to_local().ToVector<float>(), want.to_local().ToVector<float>());
  }
  EXPECT_EQ(g_infer_calls.load(), after_first) << "a step inferred shapes";
}

TEST(ExecPlan, LoweringResolvesKernelsBoxesAndBoxingPlans) {
  const Placement self = Self();
  testing::SmallGraph g("lowered", self);
  const int x = g.Input("x", Shape({4, 6}), NdSbp({S(0)}));
  const int w = g.Input("w", Shape({6, 5}), NdSbp({B()}));
  const int y = g.Op("matmul", {x, w}, {NdSbp({S(0)}), NdSbp({B()})}, Shape({4, 5}), NdSbp({S(0)}),
                     {{"transpose_a", false}, {"transpose_b", false}});
  const int whole = g.ToGlobal(y, NdSbp({B()}));
  g.graph.MarkOutput("y", whole);
  const plan::ExecPlan plan = plan::ExecPlan::Lower(g.graph, CurrentRank());
  ASSERT_EQ(plan.instructions().size(), 2u);
  EXPECT_EQ(plan.instructions_run(), 2);
  const plan::Instruction& matmul = plan.at(0);
  EXPECT_EQ(matmul.kind, plan::Instruction::Kind::kKernel);
  EXPECT_EQ(matmul.kernel, &GetOpDef("matmul").kernels.at(DeviceType::kCPU));
  ASSERT_EQ(matmul.input_boxes.size(), 2u);
  EXPECT_EQ(matmul.input_boxes[0].shape(), Shape({4, 6}));  // one rank holds all of S(0)
  EXPECT_EQ(matmul.output_layouts.at(0).meta->nd_sbp, NdSbp({S(0)}));
  EXPECT_EQ(matmul.input_boxing.at(0), nullptr);
  const plan::Instruction& boxing = plan.at(1);
  EXPECT_EQ(boxing.kind, plan::Instruction::Kind::kBoxing);
  ASSERT_NE(boxing.boxing, nullptr);
  EXPECT_EQ(boxing.boxing->dst, NdSbp({B()}));
  const std::string text = plan.ToText();
  EXPECT_NE(text.find("kernel matmul(%0, %1)"), std::string::npos) << text;
  EXPECT_NE(text.find("boxing to_global(%2)"), std::string::npos) << text;
}

TEST(ExecPlan, AnInputLaidOutOtherwiseIsBoxedByAPlanResolvedWhenLowering) {
  // A graph traced but not compiled may leave a conversion implicit: the
  // op reads x as B while x is S(1). The plan boxes it, by a plan made once.
  const Placement self = Self();
  testing::SmallGraph g("implicit", self);
  const int x = g.Input("x", Shape({3, 4}), NdSbp({S(1)}));
  const int y = g.Op("mul_scalar", {x}, {NdSbp({B()})}, Shape({3, 4}), NdSbp({B()}), {{"scalar", 2.0}});
  g.graph.MarkOutput("y", y);
  const plan::ExecPlan plan = plan::ExecPlan::Lower(g.graph, CurrentRank());
  ASSERT_NE(plan.at(0).input_boxing.at(0), nullptr);
  EXPECT_EQ(plan.at(0).input_boxing[0]->src, NdSbp({S(1)}));
  EXPECT_NE(plan.ToText().find("boxes a"), std::string::npos) << plan.ToText();
  // (Running boxing needs a world: tests/dist/graph_trace_test runs traced,
  // uncompiled graphs on the in-order executor against eager.)
}

TEST(ExecPlan, WhatExchangesDataBetweenRanksIsMarkedCommunicating) {
  // (Lowering needs no world: the plan of rank 0 of a 2-rank job.) A layout
  // change over two ranks communicates; one within a single rank does not;
  // kernels never do.
  for (const Placement& placement : {Placement(DeviceType::kCPU, {0, 1}), Placement(DeviceType::kCPU, {0})}) {
    testing::SmallGraph g("streams", placement);
    const int x = g.Input("x", Shape({4, 6}), NdSbp({S(0)}));
    const int y = g.Op("mul_scalar", {x}, {NdSbp({S(0)})}, Shape({4, 6}), NdSbp({S(0)}), {{"scalar", 2.0}});
    g.graph.MarkOutput("y", g.ToGlobal(y, NdSbp({B()})));
    const plan::ExecPlan plan = plan::ExecPlan::Lower(g.graph, 0);
    EXPECT_FALSE(plan.at(0).communicates) << placement;
    EXPECT_EQ(plan.at(1).kind, plan::Instruction::Kind::kBoxing);
    EXPECT_EQ(plan.at(1).communicates, placement.size() > 1) << placement;
  }
}

TEST(ExecPlan, AnInPlaceInputThatWouldNeedBoxingIsRefusedWhenLowering) {
  // Boxing would update a copy: the variable would silently keep its value.
  const Placement self = Self();
  testing::SmallGraph g("in_place", self);
  const int x = g.Input("x", Shape({4}), NdSbp({S(0)}));
  const int src = g.Input("src", Shape({4}), NdSbp({B()}));
  const int y = g.Op("assign", {x, src}, {NdSbp({B()}), NdSbp({B()})}, Shape({4}), NdSbp({B()}));
  g.graph.MarkOutput("y", y);
  const std::string error = testing::ErrorOf([&] { plan::ExecPlan::Lower(g.graph, CurrentRank()); });
  EXPECT_NE(error.find("in place"), std::string::npos) << error;
}

}  // namespace
}  // namespace tessel
