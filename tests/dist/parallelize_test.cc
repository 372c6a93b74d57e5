// parallelize on a job's ranks: the one-device GPT or ViT (models/plain_*)
// under a built-in policy trains with the losses the same model gives alone
// (computed here, in each process, on local tensors), within 1e-5 in f32,
// and the merged state dict after the steps equals the one-device model's
// (within 1e-4; see below).
// Run through tessel-launch (tests/dist/CMakeLists.txt: one test per model
// and policy, and tp planned for 2 ranks replicated over 4).
#include "parallel/parallelize.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "graph/autograd.h"
#include "layers/optimizer.h"
#include "models/plain_gpt.h"
#include "models/plain_vit.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

DEFINE_string(model, "gpt", "gpt or vit");
DEFINE_string(policy, "dp", "a registered policy: dp, tp, pp, hybrid");
DEFINE_int32(plan_ranks, 0, "ranks one plan copy spans (0: the world)");
DEFINE_int32(steps, 4, "training steps");
DEFINE_string(schedule, "1f1b", "pipeline schedule");
DEFINE_bool(use_zero, false, "ZeRO stage 1 over the data-parallel ranks");

namespace tessel {
namespace {

using parallel::Tensors;

std::unique_ptr<nn::LossModule> MakeModel() {
  if (FLAGS_model == "gpt")
    return std::make_unique<models::PlainGPT>(
        models::PlainGPTConfig{.vocab_size = 64, .hidden = 32, .heads = 4, .layers = 4, .max_seq = 16});
  CHECK_EQ(FLAGS_model, "vit");
  return std::make_unique<models::PlainViT>(models::PlainViTConfig{.image_size = 8,
                                                                   .patch_size = 4,
                                                                   .num_channels = 3,
                                                                   .num_classes = 8,
                                                                   .hidden = 32,
                                                                   .heads = 4,
                                                                   .layers = 4});
}

// Step `step`'s batch of 8, the same on every rank.
Tensors Batch(int step) {
  const uint64_t seed = 77 + static_cast<uint64_t>(step);
  if (FLAGS_model == "gpt") {
    const Tensor tokens = fn::cast(fn::mul_scalar(rand({8, 9}, seed), 63.999), DType::kInt64);
    return {{"ids", fn::slice(tokens, 1, 0, 8)}, {"labels", fn::slice(tokens, 1, 1, 9)}};
  }
  return {{"images", randn({8, 3, 8, 8}, seed)},
          {"labels", fn::cast(fn::mul_scalar(rand({8}, seed + 1000), 7.999), DType::kInt64)}};
}

TEST(Parallelize, LossesAndMergedWeightsMatchOneDevice) {
  // The reference: the same model alone, eagerly, on this process.
  std::unique_ptr<nn::LossModule> reference = MakeModel();
  optim::AdamWConfig adamw_config{.lr = 1e-2, .eps = 1e-6};
  const optim::NamedParams reference_params = reference->NamedParameters();
  optim::AdamW reference_adamw(reference_params, adamw_config);

  std::unique_ptr<nn::LossModule> model = MakeModel();
  auto pm = parallel::parallelize(
      *model, Batch(0), FLAGS_policy,
      {.plan_ranks = FLAGS_plan_ranks, .use_zero = FLAGS_use_zero, .schedule = FLAGS_schedule});
  auto adamw = parallel::build_optimizer(*pm, adamw_config);
  if (FLAGS_use_zero) {
    // The moments split over the data-parallel ranks, with an f32 shard of
    // each parameter: (8 + 4) / dp bytes per element, against 8 without.
    double parameter_bytes = 0;
    for (const auto& [name, p] : pm->NamedParameters())
      if (p->placement().IndexOf(CurrentRank()) >= 0)
        parameter_bytes += static_cast<double>(p->to_local().nbytes());
    const double dp = static_cast<double>(pm->plan().data_parallel * CurrentWorldSize() / pm->plan().ranks());
    const double state = static_cast<double>(adamw->LocalStateBytes());
    if (CurrentRank() == 0)
      std::printf(
          "ZeRO-1 over %.0f data-parallel ranks: optimizer state %.0f bytes for %.0f parameter bytes\n", dp,
          state, parameter_bytes);
    EXPECT_LT(state, (2.0 + 1.0) / dp * parameter_bytes * 1.3) << "parameter bytes " << parameter_bytes;
  }
  const int rank = CurrentRank();
  if (rank == 0) std::printf("plan: %s", pm->plan().ToText().c_str());

  for (int step = 0; step < FLAGS_steps; ++step) {
    const Tensors batch = Batch(step);
    Tensor loss = reference->Loss(batch);
    loss.backward();
    const double reference_norm = optim::ScalarValue(optim::ClipGradNormTensor(reference_params, 1.0));
    reference_adamw.Step();
    const double reference_loss = optim::ScalarValue(loss);

    const parallel::ParallelModule::StepResult r = pm->TrainStep(batch, *adamw, 1.0);
    if (rank == 0)
      std::printf("step %d loss %.7f one-device %.7f grad_norm %.7f one-device %.7f\n", step, r.loss,
                  reference_loss, r.grad_norm, reference_norm);
    EXPECT_NEAR(r.loss, reference_loss, 1e-5) << "step " << step;
    EXPECT_NEAR(r.grad_norm, reference_norm, 1e-5) << "step " << step;
  }
  // Evaluation: an eager forward of the parallel module.
  {
    NoGradGuard no_grad;
    const Tensors batch = Batch(FLAGS_steps);
    EXPECT_NEAR(pm->Loss(batch), optim::ScalarValue(reference->Loss(batch)), 1e-5);
  }
  // The merged weights are the one-device model's.
  const Tensors merged = parallel::merge_state_dicts(*pm);
  ASSERT_EQ(merged.size(), reference_params.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, p] : reference_params) {
    ASSERT_TRUE(merged.count(name)) << name;
    const Tensor& m = merged.at(name);
    ASSERT_EQ(m.shape(), p->shape()) << name;
    const std::vector<float> a = m.ToVector<float>(), b = p->ToVector<float>();
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] - b[i]) > worst) {
        worst = std::abs(a[i] - b[i]);
        worst_name = name;
      }
  }
  if (rank == 0)
    std::printf("merged state dict: %zu tensors, largest difference %.3g (%s)\n", merged.size(), worst,
                worst_name.c_str());
  // 1e-4 (1% of one step's lr): AdamW moves an element by about lr * g /
  // (|g| + eps) whatever |g| is, so an element whose gradient is small
  // moves by a fraction of lr that a sum taken in another order (tp's,
  // dp's reductions) changes in its last bits; the losses above are the
  // tight check.
  EXPECT_LE(worst, 1e-4) << worst_name;

  // And loading them back changes nothing.
  parallel::load_merged_state_dict(*pm, merged);
  const Tensors again = parallel::merge_state_dicts(*pm);
  for (const auto& [name, t] : merged)
    EXPECT_EQ(again.at(name).ToVector<float>(), t.ToVector<float>()) << name;
}

TEST(Parallelize, ABatchUnlikeTheSampleIsRefusedBeforeAnyStep) {
  std::unique_ptr<nn::LossModule> model = MakeModel();
  auto pm = parallel::parallelize(*model, Batch(0), FLAGS_policy, {.plan_ranks = FLAGS_plan_ranks});
  auto adamw = parallel::build_optimizer(*pm);
  Tensors wrong = Batch(0);
  const std::string first = wrong.begin()->first;
  wrong[first] = fn::slice(wrong[first], 0, 0, 4);  // 4 rows instead of 8
  try {
    pm->TrainStep(wrong, *adamw);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallelize: input '" + first + "' is "), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("as the sample inputs the plan was made for"), std::string::npos)
        << e.what();
  }
  Tensors missing = Batch(0);
  missing.erase("labels");
  try {
    pm->TrainStep(missing, *adamw);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the batch has no input 'labels'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
