// Step time of the one-device GPT (models/plain_gpt.h) under each built-in
// policy on this job's ranks, measured, beside the cost model's prediction
// (parallel/cost_model.h), for a small and a medium model; and whether
// "auto" came within 10% of the fastest hand layout (dp, tp, pp, hybrid)
// that fits the memory limit. Every layout is built first; then rounds
// time each in turn (so machine load touches all alike) and each keeps its
// fastest round. Run through tessel-launch:
//   tessel-launch --nproc_per_node 4 -- build/tests/bench/parallelize_bench --markdown
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/init.h"
#include "graph/init.h"
#include "models/plain_gpt.h"
#include "ops/functional.h"
#include "parallel/cost_model.h"
#include "parallel/parallelize.h"
#include "sbp/global_tensor.h"

DEFINE_string(sizes, "small,medium", "model sizes to run: small, medium");
DEFINE_int32(warmup, 2, "untimed steps per layout");
DEFINE_int32(steps, 4, "timed steps per layout and round");
DEFINE_int32(rounds, 3, "rounds of timing: each layout keeps its fastest");
DEFINE_double(small_memory_limit_mb, 0, "auto's memory limit for the small model (0: none)");
DEFINE_double(medium_memory_limit_mb, 0, "auto's memory limit for the medium model (0: none)");
DEFINE_bool(markdown, false, "print the table as markdown");

namespace tessel {
namespace {

struct Size {
  std::string name;
  models::PlainGPTConfig config;
  int64_t batch, seq;
  double memory_limit_mb;
};

parallel::Tensors Batch(const Size& s, int step) {
  const Tensor tokens = fn::cast(fn::mul_scalar(rand({s.batch, s.seq + 1}, 900 + static_cast<uint64_t>(step)),
                                                static_cast<double>(s.config.vocab_size) - 0.001),
                                 DType::kInt64);
  return {{"ids", fn::slice(tokens, 1, 0, s.seq)}, {"labels", fn::slice(tokens, 1, 1, s.seq + 1)}};
}

struct Row {
  std::string policy, plan, estimate;
  double measured_ms = 0, predicted_ms = 0;
  double memory_mib = 0;
  bool fits = true;
  // The layout, built and warmed up, and its optimizer.
  std::unique_ptr<models::PlainGPT> gpt;
  std::unique_ptr<parallel::ParallelModule> module;
  std::unique_ptr<optim::AdamW> adamw;
  int steps_run = 0;
};

Row Build(const Size& size, const std::string& policy, const parallel::CostModel& model) {
  Row row;
  row.policy = policy;
  row.gpt = std::make_unique<models::PlainGPT>(size.config);
  models::PlainGPT& gpt = *row.gpt;
  const int64_t limit = static_cast<int64_t>(size.memory_limit_mb * (1 << 20));
  const parallel::Policy estimated = [&](const parallel::PolicyContext& c) {
    parallel::ParallelPlan plan = parallel::GetPolicy(policy)(c);
    const parallel::PlanEstimate e = parallel::EstimatePlan(c, plan, model);
    row.predicted_ms = e.step_s * 1e3;
    row.estimate = e.ToText();
    row.memory_mib = static_cast<double>(e.memory_bytes) / (1 << 20);
    row.fits = limit <= 0 || e.memory_bytes <= limit;
    row.plan = "dp" + std::to_string(plan.data_parallel) + " tp" + std::to_string(plan.tensor_parallel) +
               " pp" + std::to_string(plan.stages) + " m" + std::to_string(plan.micro_batches);
    return plan;
  };
  row.module = parallel::parallelize(gpt, Batch(size, 0), estimated, {.memory_limit_bytes = limit});
  row.adamw = parallel::build_optimizer(*row.module, {.lr = 1e-4});
  for (; row.steps_run < FLAGS_warmup; ++row.steps_run)
    row.module->TrainStep(Batch(size, row.steps_run), *row.adamw);
  return row;
}

// One round of `row`'s timing: FLAGS_steps steps; keeps the fastest round.
void TimeRound(const Size& size, Row& row) {
  std::vector<parallel::Tensors> batches;
  for (int i = 0; i < FLAGS_steps; ++i) batches.push_back(Batch(size, row.steps_run + i));
  const auto start = std::chrono::steady_clock::now();
  for (const parallel::Tensors& batch : batches) row.module->TrainStep(batch, *row.adamw);
  const double ms =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3 / FLAGS_steps;
  row.steps_run += FLAGS_steps;
  row.measured_ms = row.measured_ms == 0 ? ms : std::min(row.measured_ms, ms);
}

}  // namespace
}  // namespace tessel

int main(int argc, char** argv) {
  using namespace tessel;
  Init(&argc, &argv);
  const std::vector<Size> sizes = {
      {"small",
       {.vocab_size = 256, .hidden = 64, .heads = 4, .layers = 4, .max_seq = 32},
       16,
       32,
       FLAGS_small_memory_limit_mb},
      {"medium",
       {.vocab_size = 1024, .hidden = 256, .heads = 8, .layers = 4, .max_seq = 64},
       16,
       64,
       FLAGS_medium_memory_limit_mb},
  };
  const parallel::CostModel model = parallel::CostModel::Measure();
  const bool root = CurrentRank() == 0;
  if (root) std::printf("%d ranks; cost model: %s\n", CurrentWorldSize(), model.ToText().c_str());
  int failures = 0;
  for (const Size& size : sizes) {
    if (FLAGS_sizes.find(size.name) == std::string::npos) continue;
    std::vector<Row> rows;
    for (const std::string policy : {"dp", "tp", "pp", "hybrid", "auto"})
      rows.push_back(Build(size, policy, model));
    for (int round = 0; round < FLAGS_rounds; ++round)
      for (Row& row : rows) TimeRound(size, row);
    double best_hand = 0;
    for (const Row& r : rows)
      if (r.policy != "auto" && r.fits && (best_hand == 0 || r.measured_ms < best_hand))
        best_hand = r.measured_ms;
    const Row& automatic = rows.back();
    const double ratio = best_hand > 0 ? automatic.measured_ms / best_hand : 0;
    if (!root) continue;
    std::printf("\nGPT %s (hidden %lld, %lld layers, vocab %lld; batch %lld x seq %lld), memory limit %s\n",
                size.name.c_str(), static_cast<long long>(size.config.hidden),
                static_cast<long long>(size.config.layers), static_cast<long long>(size.config.vocab_size),
                static_cast<long long>(size.batch), static_cast<long long>(size.seq),
                size.memory_limit_mb > 0 ? (std::to_string(size.memory_limit_mb) + " MiB").c_str() : "none");
    if (FLAGS_markdown)
      std::printf(
          "| policy | plan | measured ms/step | predicted ms/step | predicted MiB/rank | fits "
          "|\n|---|---|---|---|---|---|\n");
    for (const Row& r : rows)
      std::printf(FLAGS_markdown ? "| %s | %s | %.1f | %.1f | %.2f | %s |\n"
                                 : "%-7s %-16s measured %8.1f ms  predicted %8.1f ms  %7.2f MiB  %s\n",
                  r.policy.c_str(), r.plan.c_str(), r.measured_ms, r.predicted_ms, r.memory_mib,
                  r.fits ? "fits" : "over the limit");
    if (!FLAGS_markdown)
      for (const Row& r : rows) std::printf("  %-7s predicted %s\n", r.policy.c_str(), r.estimate.c_str());
    std::printf("auto / fastest hand layout that fits: %.2f (goal: at most 1.10)\n", ratio);
    if (ratio > 1.10) ++failures;
  }
  Shutdown();
  return 0;
}
