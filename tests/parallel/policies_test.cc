// The built-in policies on the one-device GPT and ViT, planned for 4 ranks
// in this process (nothing runs: the policies consult metadata-only
// traces), and the errors of bad plans and bad sample batches.
#include <gtest/gtest.h>

#include "core/error.h"
#include "layers/regularization.h"
#include "models/plain_gpt.h"
#include "models/plain_vit.h"
#include "ops/functional.h"
#include "parallel/cost_model.h"
#include "parallel/parallelize.h"
#include "parallel/plan_file.h"

namespace tessel::parallel {
namespace {

models::PlainGPTConfig TinyGpt() {
  return {.vocab_size = 64, .hidden = 32, .heads = 4, .layers = 2, .max_seq = 16};
}
models::PlainViTConfig TinyVit() {
  return {.image_size = 8,
          .patch_size = 4,
          .num_channels = 3,
          .num_classes = 8,
          .hidden = 32,
          .heads = 4,
          .layers = 2};
}
Tensors GptBatch(int64_t batch = 8, int64_t seq = 8) {
  return {{"ids", zeros({batch, seq}, DType::kInt64)}, {"labels", zeros({batch, seq}, DType::kInt64)}};
}
Tensors VitBatch(int64_t batch = 8) {
  return {{"images", zeros({batch, 3, 8, 8})}, {"labels", zeros({batch}, DType::kInt64)}};
}
std::string ErrorOf(const std::function<void()>& f);
std::string Split(const ParallelPlan& plan, const std::string& name) {
  auto it = plan.parameter_split.find(name);
  return it == plan.parameter_split.end() || it->second.is_broadcast() ? "B" : NdSbp({it->second}).ToString();
}

TEST(Policies, TensorParallelFindsMegatronsSplitsInTheGpt) {
  models::PlainGPT gpt(TinyGpt());
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("tp"), {.plan_ranks = 4});
  EXPECT_EQ(plan.tensor_parallel, 4);
  EXPECT_EQ(plan.stages, 1);
  for (const std::string layer : {"h0", "h1"}) {
    for (const std::string column : {".attention.query", ".attention.key", ".attention.value", ".mlp.fc1"}) {
      EXPECT_EQ(Split(plan, layer + column + ".weight"), "[S(1)]") << layer + column << "\n" << plan.ToText();
      EXPECT_EQ(Split(plan, layer + column + ".bias"), "[S(0)]") << layer + column;
    }
    for (const std::string row : {".attention.out", ".mlp.fc2"}) {
      EXPECT_EQ(Split(plan, layer + row + ".weight"), "[S(0)]") << layer + row << "\n" << plan.ToText();
      EXPECT_EQ(Split(plan, layer + row + ".bias"), "B") << layer + row;
    }
    EXPECT_EQ(Split(plan, layer + ".ln1.weight"), "B");
  }
  // The tied table: the LM head reads it transposed (a column layer), so
  // its vocabulary is split, and the lookup becomes vocab-parallel.
  EXPECT_EQ(Split(plan, "wte.weight"), "[S(0)]") << plan.ToText();
  EXPECT_EQ(Split(plan, "wpe.weight"), "B");
}

TEST(Policies, TensorParallelGptForwardReducesTwiceALayerAsMegatron) {
  // The forward under the plan: per transformer layer one all-reduce after
  // the attention's row layer and one after the MLP's; one after the
  // vocabulary-parallel lookup; the vocabulary-parallel cross-entropy's
  // three (row max, sum of exponentials, label logit); and nothing else
  // (no gather anywhere).
  models::PlainGPTConfig c = TinyGpt();
  c.layers = 3;
  models::PlainGPT gpt(c);
  int reductions = 0, other_changes = 0;
  const Policy counted = [&](const PolicyContext& context) {
    ParallelPlan plan = GetPolicy("tp")(context);
    const std::unique_ptr<ir::Graph> g = context.trace(plan);
    for (const ir::Op& op : g->ops()) {
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        const ir::Value& v = g->value(op.inputs[i]);
        const bool changed =
            op.name == "to_global" || (i < op.input_sbp.size() && op.input_sbp[i] != v.nd_sbp);
        if (!changed || !v.is_global()) continue;
        const NdSbp to = op.name == "to_global" ? g->value(op.outputs[0]).nd_sbp : op.input_sbp[i];
        if (v.nd_sbp.has_partial() && to == v.nd_sbp.WithoutPartial())
          ++reductions;
        else if (!(v.nd_sbp.size() == 1 && v.nd_sbp[0].is_broadcast() && to[0].is_split()))  // a free slice
          ++other_changes;
      }
    }
    return plan;
  };
  MakePlan(gpt, GptBatch(), counted, {.plan_ranks = 4});
  EXPECT_EQ(reductions, 2 * 3 + 1 + 3);
  EXPECT_EQ(other_changes, 0);
}

TEST(Policies, TensorParallelLeavesAColumnSplitThatAGatherWouldUndoReplicated) {
  models::PlainViT vit(TinyVit());
  const ParallelPlan plan = MakePlan(vit, VitBatch(), GetPolicy("tp"), {.plan_ranks = 4});
  // The patch embedding's output goes through a layer norm before any row
  // layer: split, it would be gathered there.
  EXPECT_EQ(Split(plan, "patch_embedding.weight"), "B") << plan.ToText();
  EXPECT_EQ(Split(plan, "h0.attention.query.weight"), "[S(1)]") << plan.ToText();
  EXPECT_EQ(Split(plan, "h1.mlp.fc2.weight"), "[S(0)]");
  EXPECT_EQ(Split(plan, "head.weight"), "[S(1)]");  // the classes, as vocab-parallel logits
  EXPECT_EQ(Split(plan, "head.bias"), "[S(0)]");
}

TEST(Policies, TensorParallelKeepsSizesItDoesNotDivideReplicated) {
  models::PlainGPTConfig c = TinyGpt();
  c.vocab_size = 66;  // not a multiple of 4
  models::PlainGPT gpt(c);
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("tp"), {.plan_ranks = 4});
  EXPECT_EQ(Split(plan, "wte.weight"), "B") << plan.ToText();
  EXPECT_EQ(Split(plan, "h0.attention.query.weight"), "[S(1)]");
}

TEST(Policies, PipelineCutsBeforeNewParametersInCostOrder) {
  models::PlainGPTConfig c = TinyGpt();
  c.layers = 4;
  models::PlainGPT gpt(c);
  std::unique_ptr<ir::Graph> g;
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("pp"), {.plan_ranks = 4});
  EXPECT_EQ(plan.stages, 4);
  EXPECT_EQ(plan.micro_batches, 8);  // 2 x stages, which the 8 rows allow
  int last = 0;
  std::set<int> used;
  for (int s : plan.op_stage) {
    EXPECT_GE(s, last);
    last = s;
    used.insert(s);
  }
  EXPECT_EQ(used.size(), 4u);
  ASSERT_FALSE(plan.reasons.empty());
  EXPECT_NE(plan.reasons[0].find("pipeline: 4 stages cut before ops"), std::string::npos) << plan.reasons[0];
}

TEST(Policies, HybridDefaultsToTensorAndPipelineOfTwo) {
  models::PlainGPT gpt(TinyGpt());
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("hybrid"), {.plan_ranks = 4});
  EXPECT_EQ(plan.tensor_parallel, 2);
  EXPECT_EQ(plan.stages, 2);
  EXPECT_EQ(plan.data_parallel, 1);
  EXPECT_EQ(Split(plan, "h1.mlp.fc1.weight"), "[S(1)]") << plan.ToText();
  const ParallelPlan dp = MakePlan(gpt, GptBatch(), GetPolicy("hybrid"),
                                   {.plan_ranks = 4, .data_parallel_size = 2, .tensor_parallel_size = 2});
  EXPECT_EQ(dp.data_parallel, 2);
  EXPECT_EQ(dp.stages, 1);
  EXPECT_EQ(Split(dp, "h0.mlp.fc2.weight"), "[S(0)]") << dp.ToText();
}

TEST(Policies, DataParallelSplitsNothing) {
  models::PlainGPT gpt(TinyGpt());
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("dp"), {.plan_ranks = 4});
  EXPECT_EQ(plan.data_parallel, 4);
  EXPECT_TRUE(plan.parameter_split.empty());
}

TEST(Policies, CostModelSplitsMemoryAndAddsTensorParallelCollectives) {
  models::PlainGPT gpt(TinyGpt());
  std::map<std::string, PlanEstimate> estimates;
  const CostModel model;  // the defaults: the figures below are ratios
  for (const std::string name : {"dp", "tp", "pp"}) {
    const Policy estimated = [&](const PolicyContext& c) {
      ParallelPlan plan = GetPolicy(name)(c);
      estimates[name] = EstimatePlan(c, plan, model);
      return plan;
    };
    MakePlan(gpt, GptBatch(), estimated, {.plan_ranks = 4});
  }
  // dp holds every parameter with its gradient and moments; tp and pp a
  // part (tp keeps whole activations, which this tiny model has many of).
  EXPECT_GT(estimates["dp"].memory_bytes, estimates["tp"].memory_bytes) << estimates["dp"].ToText() << "\n"
                                                                        << estimates["tp"].ToText();
  EXPECT_GT(estimates["dp"].memory_bytes, 2 * estimates["pp"].memory_bytes)
      << estimates["dp"].ToText() << "\n"
      << estimates["pp"].ToText();
  // tp: 2 per layer each way, the lookup's and the loss's, forward and backward.
  EXPECT_EQ(estimates["tp"].collectives, 2 * (2 * 2 + 1 + 3)) << estimates["tp"].ToText();
  EXPECT_GT(estimates["pp"].bubble, 0.2);
  EXPECT_EQ(estimates["dp"].bubble, 0);
}

TEST(Policies, AutoPrintsWhatItWeighedAndRefusesAnUnmeetableMemoryLimit) {
  models::PlainGPT gpt(TinyGpt());
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("auto"), {.plan_ranks = 4});
  EXPECT_EQ(plan.ranks(), 4);
  const std::string text = plan.ToText();
  EXPECT_NE(text.find("auto: chose data "), std::string::npos) << text;
  EXPECT_NE(text.find("auto:   data 1 x tensor 2 x pipeline 2, 4 micro-batches: "), std::string::npos)
      << text;
  const std::string e = ErrorOf(
      [&] { MakePlan(gpt, GptBatch(), GetPolicy("auto"), {.plan_ranks = 4, .memory_limit_bytes = 1000}); });
  EXPECT_NE(e.find("no plan meets the memory limit of 1000 bytes per rank; the smallest of the"),
            std::string::npos)
      << e;
  // Within a limit only the pipeline's and tensor's plans meet, auto picks one of them.
  const ParallelPlan tight =
      MakePlan(gpt, GptBatch(), GetPolicy("auto"), {.plan_ranks = 4, .memory_limit_bytes = 200 * 1024});
  EXPECT_EQ(tight.data_parallel, 1) << tight.ToText();
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Policies, APlanLeavingAnOpWithoutAStageIsRefusedNamingIt) {
  models::PlainGPT gpt(TinyGpt());
  const Policy lazy = [](const PolicyContext& c) {
    ParallelPlan plan;
    plan.policy = "lazy";
    plan.stages = 2;
    plan.data_parallel = 1;
    plan.tensor_parallel = 2;
    plan.op_stage.assign(c.graph.ops().size(), 0);
    plan.op_stage[3] = -1;
    return plan;
  };
  const std::string e = ErrorOf([&] { MakePlan(gpt, GptBatch(), lazy, {.plan_ranks = 4}); });
  EXPECT_NE(e.find("policy 'lazy' leaves op 3 '"), std::string::npos) << e;
  EXPECT_NE(e.find("without a placement (stage -1; expected 0..1)"), std::string::npos) << e;
}

TEST(Policies, APlanSendingForwardValuesBackIsRefused) {
  models::PlainGPT gpt(TinyGpt());
  const Policy backwards = [](const PolicyContext& c) {
    ParallelPlan plan;
    plan.policy = "backwards";
    plan.stages = 2;
    plan.op_stage.assign(c.graph.ops().size(), 0);
    for (size_t i = 0; i < plan.op_stage.size() / 2; ++i) plan.op_stage[i] = 1;
    return plan;
  };
  const std::string e = ErrorOf([&] { MakePlan(gpt, GptBatch(), backwards, {.plan_ranks = 2}); });
  EXPECT_NE(e.find("before op"), std::string::npos) << e;
  EXPECT_NE(e.find("forward values only flow to later stages"), std::string::npos) << e;
}

TEST(Policies, SampleInputsTheModelRefusesAreNamed) {
  models::PlainGPT gpt(TinyGpt());
  const std::string e = ErrorOf([&] { MakePlan(gpt, GptBatch(8, 20), GetPolicy("dp"), {.plan_ranks = 4}); });
  EXPECT_NE(e.find("refused the sample inputs (ids i64 [8, 20], labels i64 [8, 20])"), std::string::npos)
      << e;
  EXPECT_NE(e.find("exceeds max_seq=16"), std::string::npos) << e;
  models::PlainViT vit(TinyVit());
  const std::string v = ErrorOf([&] {
    MakePlan(vit, {{"images", zeros({8, 3, 16, 16})}, {"labels", zeros({8}, DType::kInt64)}}, GetPolicy("dp"),
             {.plan_ranks = 4});
  });
  EXPECT_NE(v.find("images of shape [8, 3, 16, 16]; expected [batch, 3, 8, 8]"), std::string::npos) << v;
}

// A model with dropout is refused before any plan, named.
struct DropoutModel : nn::LossModule {
  mutable layers::Dropout dropout{0.1};  // draws (advances its counter) in a const Loss
  Tensor w = randn({8, 4}, 1).set_requires_grad(true);
  DropoutModel() {
    RegisterParameter("w", w);
    RegisterModule("dropout", dropout);
  }
  Tensor Loss(const std::map<std::string, Tensor>& in) const override {
    Tensor y = fn::matmul(dropout(in.at("x")), w);
    return fn::mean(fn::mul(y, y), {0, 1});
  }
};

TEST(Policies, AModelThatDrawsDropoutMasksIsNamed) {
  DropoutModel model;
  const std::string e = ErrorOf([&] {
    MakePlan(model, {{"x", zeros({8, 8})}}, GetPolicy("dp"), {.plan_ranks = 4});
  });
  EXPECT_NE(e.find("parallelize: the model draws random masks (op 2 'rng_advance'"), std::string::npos) << e;
  EXPECT_NE(e.find("set the dropout probabilities to 0"), std::string::npos) << e;
}

TEST(PlanFile, APlanSavedIsTheOneLoadedForTheSameModelAndRefusedForAnother) {
  models::PlainGPT gpt(TinyGpt());
  const ParallelPlan plan = MakePlan(gpt, GptBatch(), GetPolicy("hybrid"), {.plan_ranks = 4});
  ASSERT_NE(plan.model_fingerprint.find("fnv1a64:"), std::string::npos);
  const std::string path = ::testing::TempDir() + "/gpt.plan";
  SavePlan(plan, path);
  const ParallelPlan loaded = MakePlan(gpt, GptBatch(), PlanFromFile(path), {.plan_ranks = 4});
  EXPECT_EQ(loaded.op_stage, plan.op_stage);
  EXPECT_EQ(loaded.parameter_split, plan.parameter_split);
  EXPECT_EQ(loaded.micro_batches, plan.micro_batches);
  EXPECT_EQ(loaded.reasons.front(), "loaded from " + path);
  EXPECT_EQ(PlanToText(ParsePlanText(PlanToText(plan), "again")), PlanToText(plan));

  // Another sample batch, another model, another plan size: each named.
  std::string e = ErrorOf([&] { MakePlan(gpt, GptBatch(8, 12), PlanFromFile(path), {.plan_ranks = 4}); });
  EXPECT_NE(e.find("was made for another model or sample batch"), std::string::npos) << e;
  models::PlainGPTConfig c = TinyGpt();
  c.layers = 3;
  models::PlainGPT deeper(c);
  e = ErrorOf([&] { MakePlan(deeper, GptBatch(), PlanFromFile(path), {.plan_ranks = 4}); });
  EXPECT_NE(e.find("was made for another model or sample batch"), std::string::npos) << e;
  e = ErrorOf([&] { MakePlan(gpt, GptBatch(), PlanFromFile(path), {.plan_ranks = 8}); });
  EXPECT_NE(e.find("spans 4 ranks; this job plans 8"), std::string::npos) << e;
  e = ErrorOf([&] { ParsePlanText("stages: 0 data_parallel: 1", "bad.plan"); });
  EXPECT_NE(e.find("plan bad.plan: "), std::string::npos) << e;
  e = ErrorOf([&] { ParsePlanText("stages: [", "broken.plan"); });
  EXPECT_NE(e.find("plan broken.plan: line 1:"), std::string::npos) << e;
  e = ErrorOf([&] { MakePlan(gpt, GptBatch(), PlanFromFile(path + ".missing"), {.plan_ranks = 4}); });
  EXPECT_NE(e.find("cannot read it"), std::string::npos) << e;
}

TEST(Policies, UnknownPolicyNamesTheRegisteredOnes) {
  const std::string e = ErrorOf([] { GetPolicy("magic"); });
  EXPECT_NE(e.find("unknown parallelization policy 'magic'; registered: auto, dp, hybrid, pp, tp"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace tessel::parallel
