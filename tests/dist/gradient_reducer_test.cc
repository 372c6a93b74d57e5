// Gradient reducers (layers/gradient_handler.h) on a GPT under data
// parallelism (--tp for dp x tp), without and with ZeRO 1 (a reduce-scatter
// into the shards): the built-in bf16_all_reduce gives the f32 reduction's
// gradients within its documented bound, elementwise — 2^-8 x (the sum of
// the ranks' parts' magnitudes + the sum's magnitude) — and differs from it
// (it did send bf16); a reducer that leaves a gradient unreduced is named
// with the parameter; one that relabels each rank's own part as the sum
// keeps the layouts but not the values, and the losses of SGD steps on it
// leave the reduced run's (while bf16's stay within 1e-3 of them).
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/gradient_handler.h"
#include "layers/optimizer.h"
#include "models/gpt.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_int64(tp, 1, "tensor parallel size (dp is the rest of the world)");

namespace tessel {
namespace {

struct Model {
  std::unique_ptr<models::GPT> gpt;
  optim::NamedParams params;
  Tensor ids, labels;
};

Model Build(int64_t zero_stage) {
  dist::Setup({.tensor_parallel_size = FLAGS_tp, .pipeline_num_layers = 2, .zero_stage = zero_stage});
  Model m;
  m.gpt = std::make_unique<models::GPT>(
      models::GPTConfig{.vocab_size = 512, .hidden = 64, .heads = 4, .layers = 2, .max_seq = 16});
  m.params = m.gpt->NamedParameters();
  const Placement p = dist::GetLayerPlacement(0);
  std::vector<int64_t> ids(8 * 16), labels(8 * 16);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7919 + 13) % 512);
    labels[i] = static_cast<int64_t>((i * 104729 + 7) % 512);
  }
  const NdSbp rows = dist::GetHiddenSbp();
  m.ids =
      Tensor::FromVector<int64_t>(ids, {8, 16}).to_global(p, dist::GetNdSbp({B(), B()})).to_global(p, rows);
  m.labels = Tensor::FromVector<int64_t>(labels, {8, 16})
                 .to_global(p, dist::GetNdSbp({B(), B()}))
                 .to_global(dist::GetLayerPlacement(-1), rows);
  return m;
}

Tensor Loss(Model& m) { return m.gpt->Loss(m.ids, m.labels); }

// Each parameter's gradient as `reducer` leaves it (the layout's own
// reduction when null), gathered whole; with `parts`, also the sum over
// the ranks of each rank's part's magnitudes, gathered.
std::vector<Tensor> ReducedGradients(int64_t zero_stage, const optim::GradientReducer& reducer,
                                     std::vector<Tensor>* parts = nullptr) {
  Model m = Build(zero_stage);
  optim::AdamW adamw(m.params, {.zero_stage = zero_stage});
  Loss(m).backward();
  if (parts != nullptr) {
    NoGradGuard no_grad;
    for (auto& [name, p] : m.params) {
      const Tensor g = p->grad();
      // |part| on each rank, added over the axes the gradient is Partial on.
      const Tensor part = g.to_local();
      const Tensor magnitude =
          fn::add(fn::relu(part), fn::relu(fn::neg(part))).to_global(g.placement(), g.nd_sbp());
      parts->push_back(GatherLogical(magnitude.to_global(p->placement(), p->nd_sbp())));
    }
  }
  optim::ReduceGradients(m.params, adamw.GradientLayouts(), reducer, "under test");
  std::vector<Tensor> out;
  for (auto& [name, p] : m.params) {
    EXPECT_EQ(p->grad().nd_sbp(), adamw.GradientLayouts()[out.size()]) << name;
    out.push_back(GatherLogical(p->grad().to_global(p->placement(), p->nd_sbp())));
  }
  return out;
}

TEST(GradientReducer, Bf16AllReduceIsWithinItsBoundOfTheF32Reduction) {
  ASSERT_GT(dist::WorldSize() / FLAGS_tp, 1) << "run on more ranks than --tp: the reducers reduce over dp";
  const optim::GradientReducer bf16 = optim::MakeGradientReducer("bf16_all_reduce", {});
  for (int64_t zero_stage : {0, 1}) {
    std::vector<Tensor> parts;
    const std::vector<Tensor> f32 = ReducedGradients(zero_stage, nullptr, &parts);
    const std::vector<Tensor> narrow = ReducedGradients(zero_stage, bf16);
    ASSERT_EQ(f32.size(), narrow.size());
    double worst = 0, largest = 0;  // of |error| / bound, and of |error|
    for (size_t i = 0; i < f32.size(); ++i) {
      const std::vector<float> want = f32[i].ToVector<float>(), got = narrow[i].ToVector<float>(),
                               sum_of_parts = parts[i].ToVector<float>();
      ASSERT_EQ(want.size(), got.size());
      for (size_t e = 0; e < want.size(); ++e) {
        const double error = std::abs(static_cast<double>(got[e]) - want[e]);
        // (The f32 sum's own rounding, in another order, on top.)
        const double bound =
            std::ldexp(sum_of_parts[e] + std::abs(want[e]), -8) + 1e-6 * sum_of_parts[e] + 1e-30;
        worst = std::max(worst, error / bound);
        largest = std::max(largest, error);
        ASSERT_LE(error, bound) << "ZeRO " << zero_stage << " parameter " << i << " element " << e << ": "
                                << got[e] << " against " << want[e];
      }
    }
    if (CurrentRank() == 0)
      std::printf("bf16_all_reduce, ZeRO %ld: largest error %.3g, %.2f of the bound at worst\n",
                  static_cast<long>(zero_stage), largest, worst);
    EXPECT_GT(largest, 0) << "ZeRO " << zero_stage << ": no difference at all; were bf16 values sent?";
  }
}

TEST(GradientReducer, AReducerThatLeavesAGradientUnreducedIsNamed) {
  const std::string error = testing::ErrorOf(
      [] { ReducedGradients(0, [](const optim::NamedParams&, const std::vector<NdSbp>&) {}); });
  EXPECT_NE(error.find("gradient reducer 'under test' left the gradient of '"), std::string::npos) << error;
  EXPECT_NE(error.find("; expected "), std::string::npos) << error;
}

// Each rank's own part relabelled as the whole: the layouts the optimizer
// expects, not the sum.
void Relabel(const optim::NamedParams& params, const std::vector<NdSbp>& layouts) {
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor* p = params[i].second;
    const Tensor g = p->grad();
    if (!g.defined()) continue;
    // (Called without ZeRO: each layout's local shard is the whole of the
    // rank's part, which from_local then labels as the sum.)
    p->set_grad(g.to_local().to_global(p->placement(), layouts[i]));
  }
}

// Losses of `steps` SGD steps (lr 0.5) reduced by `reducer`.
std::vector<double> SgdLosses(const optim::GradientReducer& reducer, int steps) {
  Model m = Build(0);
  optim::SGD sgd(m.params, 0.5);
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    Tensor loss = Loss(m);
    losses.push_back(optim::ScalarValue(loss));
    loss.backward();
    optim::ReduceGradients(m.params, {}, reducer, "under test");
    sgd.Step();
  }
  return losses;
}

TEST(GradientReducer, ARelabellingReducerKeepsTheLayoutsAndLosesTheSum) {
  const std::vector<double> reduced = SgdLosses(nullptr, 4),
                            bf16 = SgdLosses(optim::MakeGradientReducer("bf16_all_reduce", {}), 4),
                            relabelled = SgdLosses(Relabel, 4);
  if (CurrentRank() == 0)
    for (size_t i = 0; i < reduced.size(); ++i)
      std::printf("step %zu: reduced %.6f, bf16 %.6f, relabelled %.6f\n", i, reduced[i], bf16[i],
                  relabelled[i]);
  // The reduced run learns, the bf16 run with it; the relabelled run (each
  // rank stepping on its own part) goes elsewhere.
  EXPECT_LT(reduced.back(), reduced.front());
  for (size_t i = 0; i < reduced.size(); ++i)
    EXPECT_NEAR(bf16[i], reduced[i], 1e-3 * std::abs(reduced[i])) << i;
  EXPECT_GT(std::abs(relabelled.back() - reduced.back()), 1e-2 * std::abs(reduced.back()));
}

}  // namespace
}  // namespace tessel
