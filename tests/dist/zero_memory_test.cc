// ZeRO's memory per rank, measured on a GPT under dp (--tp for tp x dp):
// after a backward, the bytes this rank holds of the parameters, their
// gradients and the optimizer's state against the formulas for f32 training
// (Ψ: the parameter elements a rank holds without ZeRO, N_d: dp)
//   off      4Ψ + 4Ψ + 8Ψ                 (parameters, gradients, moments)
//   stage 1  4Ψ + 4Ψ + (8Ψ + 4Ψ)/N_d      (moments and an f32 shard split)
//   stage 2  4Ψ + (4Ψ + 8Ψ + 4Ψ)/N_d      (gradients split too)
//   stage 3  (4Ψ + 4Ψ + 8Ψ)/N_d           (parameters split too; no shard)
// within 5%, and the step after it leaves the same parameters as without
// ZeRO (within 1e-3 relative: the first AdamW step moves each weight by
// lr * g / (|g| + eps), and a gradient within a few eps of zero, summed in
// another order by a reduce-scatter than by an all-reduce, moves by a
// visibly different fraction of lr; the 20-step losses agree within 1e-5,
// test_train_zero.py). Prints each stage's figures (docs/benchmarks.md).
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/optimizer.h"
#include "models/gpt.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_int64(tp, 1, "tensor parallel size (dp is the rest of the world)");
DEFINE_int64(layers, 2, "GPT layers");
DEFINE_int64(hidden, 128, "GPT hidden size");
DEFINE_int64(heads, 4, "GPT attention heads");
DEFINE_int64(vocab, 1024, "GPT vocabulary");

namespace tessel {
namespace {

struct Held {
  int64_t params = 0, grads = 0, state = 0;
  std::vector<Tensor> after_step;  // every parameter's logical value after one step
};

int64_t LocalBytes(const Tensor& t) { return t.defined() ? static_cast<int64_t>(t.to_local().nbytes()) : 0; }

Held TrainOneStep(int64_t stage) {
  dist::Setup({.tensor_parallel_size = FLAGS_tp, .pipeline_num_layers = FLAGS_layers, .zero_stage = stage});
  models::GPT gpt({.vocab_size = FLAGS_vocab,
                   .hidden = FLAGS_hidden,
                   .heads = FLAGS_heads,
                   .layers = FLAGS_layers,
                   .max_seq = 32});
  auto params = gpt.NamedParameters();
  optim::AdamW adamw(params, {.zero_stage = stage});
  const Placement p = dist::GetLayerPlacement(0);
  std::vector<int64_t> ids(8 * 32), labels(8 * 32);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7919 + 13) % FLAGS_vocab);
    labels[i] = static_cast<int64_t>((i * 104729 + 7) % FLAGS_vocab);
  }
  const NdSbp rows = dist::GetHiddenSbp();
  const Tensor ids_t = Tensor::FromVector<int64_t>(ids, {8, 32}).to_global(p, dist::GetNdSbp({B(), B()}));
  const Tensor labels_t =
      Tensor::FromVector<int64_t>(labels, {8, 32}).to_global(p, dist::GetNdSbp({B(), B()}));
  gpt.Loss(ids_t.to_global(p, rows), labels_t.to_global(dist::GetLayerPlacement(-1), rows)).backward();
  Held held;
  for (auto& [name, t] : params) {
    held.params += LocalBytes(*t);
    held.grads += LocalBytes(t->grad());
  }
  held.state = adamw.LocalStateBytes();
  optim::ClipGradNorm(params, 1.0, adamw.GradientLayouts());
  adamw.Step();
  for (auto& [name, t] : params) held.after_step.push_back(GatherLogical(t->detach()));
  return held;
}

TEST(Zero, MemoryPerRankMatchesTheFormulasAndTheStepIsTheSame) {
  const Held off = TrainOneStep(0);
  const double psi = static_cast<double>(off.params) / 4.0;  // f32 elements per rank without ZeRO
  const double dp = static_cast<double>(dist::GetConfig().data_parallel_size);
  ASSERT_GT(dp, 1) << "run on more ranks than --tp: ZeRO splits over data-parallel ranks";
  EXPECT_EQ(off.grads, off.params);
  const double expected[4][3] = {{4 * psi, 4 * psi, 8 * psi},
                                 {4 * psi, 4 * psi, 12 * psi / dp},
                                 {4 * psi, 4 * psi / dp, 12 * psi / dp},
                                 {4 * psi / dp, 4 * psi / dp, 8 * psi / dp}};
  for (int64_t stage = 0; stage <= 3; ++stage) {
    const Held h = stage == 0 ? off : TrainOneStep(stage);
    const double total = static_cast<double>(h.params + h.grads + h.state);
    const double want = expected[stage][0] + expected[stage][1] + expected[stage][2];
    if (CurrentRank() == 0)
      std::printf(
          "ZeRO stage %ld, dp %.0f, tp %ld: parameters %.3f MB, gradients %.3f MB, optimizer %.3f MB; "
          "total %.3f MB, formula %.3f MB (%.2f%%)\n",
          static_cast<long>(stage), dp, static_cast<long>(FLAGS_tp), h.params / 1e6, h.grads / 1e6,
          h.state / 1e6, total / 1e6, want / 1e6, 100.0 * (total - want) / want);
    EXPECT_NEAR(total, want, 0.05 * want) << "stage " << stage;
    EXPECT_NEAR(static_cast<double>(h.params), expected[stage][0], 0.05 * expected[stage][0])
        << "stage " << stage;
    EXPECT_NEAR(static_cast<double>(h.grads), expected[stage][1], 0.05 * expected[stage][1])
        << "stage " << stage;
    ASSERT_EQ(h.after_step.size(), off.after_step.size());
    for (size_t i = 0; i < h.after_step.size(); ++i)
      EXPECT_LE(testing::RelError(h.after_step[i], off.after_step[i]), 1e-3)
          << "stage " << stage << " param " << i;
  }
}

}  // namespace
}  // namespace tessel
