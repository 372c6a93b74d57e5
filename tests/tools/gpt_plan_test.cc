// tessel-plan's GPT plans against Megatron-LM's communication formulas
// (Narayanan et al., 2021: per transformer layer, two all-reduces of the
// b*s*h activations on the tensor-parallel group in forward and two in
// backward; the data-parallel gradient all-reduce moves the rank's
// parameters; a pipeline boundary sends b*s*h per micro-batch each way).
#include "tools/plan/gpt_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/error.h"
#include "runtime/pipeline_schedule.h"

namespace tessel::plan {
namespace {

// GPT-2 124M's sizes (vocabulary padded to 50304, as Megatron and LiBai pad it).
models::GPTConfig Gpt2Small() {
  return {.vocab_size = 50304, .hidden = 768, .heads = 12, .layers = 12, .max_seq = 1024};
}

CommTally Tally(const GptPlan& plan, int64_t layer, bool backward, const std::string& group,
                const std::string& kind) {
  auto it = plan.comm.find({layer, backward, group, kind});
  return it == plan.comm.end() ? CommTally{} : it->second;
}

// The layers whose computation the rank's plan holds (not counting the
// layout change that sends the hidden states into the next stage's first
// layer, which belongs to that layer).
// The layers whose ops the rank computes (ops moving data take their
// reader's layer: a send's is on the next stage).
std::set<int64_t> LayersOf(const GptPlan& plan) {
  std::set<int64_t> layers;
  for (const auto& op : plan.plan.ops())
    if (op.has_layer() && op.name() != "to_global" && op.name() != "send" && op.name() != "recv")
      layers.insert(op.layer());
  return layers;
}

TEST(GptPlan, TensorParallelLayersAllReduceTheActivationsTwiceEachWay) {
  GptPlanOptions o{.model = Gpt2Small(), .tensor_parallel_size = 4, .micro_batch_size = 2};
  for (int rank : {0, 3}) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    const int64_t bsh = 2 * 1024 * 768;
    EXPECT_EQ(LayersOf(plan).size(), 12u);
    for (int64_t layer = 0; layer < 12; ++layer) {
      for (bool backward : {false, true}) {
        SCOPED_TRACE("rank " + std::to_string(rank) + " layer " + std::to_string(layer) +
                     (backward ? " backward" : " forward"));
        const CommTally t = Tally(plan, layer, backward, "tp", "all-reduce");
        EXPECT_EQ(t.count, 2);
        EXPECT_EQ(t.elements, 2 * bsh);
        EXPECT_EQ(t.bytes, 2 * bsh * 4);
      }
    }
    // Nothing else inside the layers: no other kind, no other group.
    for (const auto& [k, t] : plan.comm) {
      if (k.layer >= 0) {
        EXPECT_TRUE(k.group == "tp" && k.kind == "all-reduce") << k.group << " " << k.kind;
      }
    }
  }
}

TEST(GptPlan, DataParallelGradientsAreReducedOnceAStepInTheRanksParameterBytes) {
  // dp2 x tp2 with 4 micro-batches: the layers' all-reduces come once per
  // micro-batch, the gradients' once per step.
  GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 128, .heads = 4, .layers = 3, .max_seq = 64},
                   .tensor_parallel_size = 2,
                   .data_parallel_size = 2,
                   .micro_batch_size = 2,
                   .micro_batches = 4};
  for (int rank = 0; rank < 4; ++rank) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_GT(plan.parameter_bytes, 0);
    EXPECT_EQ(Tally(plan, -1, true, "dp", "all-reduce").bytes, plan.parameter_bytes);
    for (int64_t layer = 0; layer < 3; ++layer) {
      EXPECT_EQ(Tally(plan, layer, false, "tp", "all-reduce").count, 2 * 4);
      EXPECT_EQ(Tally(plan, layer, false, "tp", "all-reduce").elements, 2 * 4 * 2 * 64 * 128);
      EXPECT_EQ(Tally(plan, layer, true, "tp", "all-reduce").elements, 2 * 4 * 2 * 64 * 128);
      EXPECT_EQ(Tally(plan, layer, true, "dp", "all-reduce").count, 0);  // not per layer: bucketed
    }
  }
}

TEST(GptPlan, PipelineBoundariesSendTheHiddenStatesOncePerMicroBatchEachWay) {
  // 8 layers on 4 stages (2 each), tp2, 8 micro-batches.
  GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 64, .heads = 4, .layers = 8, .max_seq = 32},
                   .tensor_parallel_size = 2,
                   .pipeline_parallel_size = 4,
                   .micro_batch_size = 2,
                   .micro_batches = 8};
  const int64_t bsh = 2 * 32 * 64, m = 8;
  for (int rank = 0; rank < 8; ++rank) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    const int stage = rank / 2;
    SCOPED_TRACE("rank " + std::to_string(rank) + " on stage " + std::to_string(stage));
    EXPECT_EQ(plan.stage, stage);
    EXPECT_EQ(LayersOf(plan), (std::set<int64_t>{2 * stage, 2 * stage + 1}));
    // Every op of the plan runs on this stage (local ones on every rank);
    // the boundaries are the stage's sends and receives.
    int sends = 0, recvs = 0;
    for (const auto& op : plan.plan.ops()) {
      if (op.has_stage()) {
        EXPECT_EQ(op.stage(), stage) << "op " << op.op() << " " << op.name();
      }
      // (A unit's transfer is listed once and runs once per micro-batch.)
      sends += op.name() == "send" ? op.runs() : 0;
      recvs += op.name() == "recv" ? op.runs() : 0;
      if (op.name() == "send" || op.name() == "recv") {
        ASSERT_EQ(op.comms_size(), 1);
        EXPECT_EQ(op.comms(0).kind(), op.name());
      }
    }
    EXPECT_GE(sends, stage < 3 ? m : 1);
    EXPECT_GE(recvs, stage > 0 ? m : 1);
    EXPECT_NEAR(plan.bubble_fraction, 3.0 / 11.0, 1e-12);
    // The boundary into layer 2s+2 (this stage's next): its first op
    // receives the hidden states there, so the transfer counts in that layer.
    if (stage < 3) {
      const CommTally fwd = Tally(plan, 2 * stage + 2, false, "pp", "send");
      const CommTally bwd = Tally(plan, 2 * stage + 2, true, "pp", "recv");
      EXPECT_EQ(fwd.count, m);
      EXPECT_EQ(fwd.elements, m * bsh);
      EXPECT_EQ(bwd.count, m);
      EXPECT_EQ(bwd.elements, m * bsh);
    }
    if (stage > 0) {
      EXPECT_EQ(Tally(plan, 2 * stage, false, "pp", "recv").elements, m * bsh);
      EXPECT_EQ(Tally(plan, 2 * stage, true, "pp", "send").elements, m * bsh);
    }
    // Within the layers, only the tensor-parallel all-reduces (2 per micro-batch each way).
    for (int64_t layer : {2 * stage, 2 * stage + 1}) {
      EXPECT_EQ(Tally(plan, layer, false, "tp", "all-reduce").count, 2 * m);
      EXPECT_EQ(Tally(plan, layer, true, "tp", "all-reduce").count, 2 * m);
    }
  }
}

TEST(GptPlan, ThousandRankJobOfTheSameFormCompilesOneRanksPlan) {
  // tp8 x pp16 x dp8 like the 96-layer, hidden-12288 benchmark
  // (docs/benchmarks.md), with smaller layers: each rank compiles its own.
  GptPlanOptions o{.model = {.vocab_size = 4096, .hidden = 512, .heads = 16, .layers = 32, .max_seq = 128},
                   .tensor_parallel_size = 8,
                   .pipeline_parallel_size = 16,
                   .data_parallel_size = 8,
                   .micro_batch_size = 1,
                   .micro_batches = 2};
  for (int rank : {0, 517, 1023}) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(plan.world_size, 1024);
    EXPECT_EQ(plan.stage, rank / 64);
    EXPECT_EQ(LayersOf(plan), (std::set<int64_t>{2 * (rank / 64), 2 * (rank / 64) + 1}));
    EXPECT_LT(plan.plan.ops_size(), plan.logical_ops / 4);  // its own stage's ops only
    for (const auto& op : plan.plan.ops()) {
      for (const auto& c : op.comms()) {
        if (c.kind() == "all-reduce" && c.elements() > 1) {
          EXPECT_EQ(c.ranks_size(), 8);
        }
        for (int peer : c.ranks()) EXPECT_TRUE(peer >= 0 && peer < 1024);
      }
    }
    EXPECT_EQ(Tally(plan, 2 * (rank / 64), false, "tp", "all-reduce").elements, 2 * 2 * 128 * 512);
    EXPECT_EQ(Tally(plan, -1, true, "dp", "all-reduce").bytes, plan.parameter_bytes);
  }
}

// What a rank compiles does not grow with the micro-batch count: the
// compiled graph holds the micro-batch units once and the rank's plan lists
// each once (with the runs a step makes of it), so 64 micro-batches compile
// the same ops as 2 while the step's communication is 32 times as much.
TEST(GptPlan, MoreMicroBatchesCompileTheSameOpsAndRunThemMoreOften) {
  GptPlanOptions o{.model = {.vocab_size = 4096, .hidden = 512, .heads = 16, .layers = 32, .max_seq = 128},
                   .tensor_parallel_size = 8,
                   .pipeline_parallel_size = 16,
                   .data_parallel_size = 8,
                   .rank = 517,
                   .micro_batch_size = 1};
  o.micro_batches = 2;
  const GptPlan two = PlanGpt(o);
  o.micro_batches = 64;
  const GptPlan many = PlanGpt(o);
  EXPECT_EQ(many.logical_ops, two.logical_ops);
  EXPECT_EQ(many.plan.ops_size(), two.plan.ops_size());
  int units = 0;
  for (const auto& op : many.plan.ops()) {
    EXPECT_TRUE(op.runs() == 1 || op.runs() == 64) << op.name() << " runs " << op.runs();
    units += op.runs() == 64;
  }
  EXPECT_GT(units, many.plan.ops_size() / 3);  // forward and backward (the rest: the optimizer, buckets)
  const int64_t layer = 2 * (517 / 64);
  EXPECT_EQ(Tally(many, layer, false, "tp", "all-reduce").count,
            32 * Tally(two, layer, false, "tp", "all-reduce").count);
  EXPECT_EQ(Tally(many, layer, false, "pp", "recv").elements,
            32 * Tally(two, layer, false, "pp", "recv").elements);
  // The gradients are still reduced once a step.
  EXPECT_EQ(Tally(many, -1, true, "dp", "all-reduce").bytes, Tally(two, -1, true, "dp", "all-reduce").bytes);
}

TEST(GptPlan, RankPlansAreTheSameBytesOnEveryCompile) {
  GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 64, .heads = 4, .layers = 4, .max_seq = 32},
                   .tensor_parallel_size = 2,
                   .pipeline_parallel_size = 2,
                   .data_parallel_size = 2,
                   .rank = 5,
                   .micro_batches = 2};
  const std::string first = PlanGpt(o).plan.SerializeAsString();
  EXPECT_FALSE(first.empty());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(PlanGpt(o).plan.SerializeAsString(), first);
}

TEST(GptPlan, SizesThatDoNotFitAreNamed) {
  GptPlanOptions o{.model = {.layers = 2}, .tensor_parallel_size = 2, .pipeline_parallel_size = 2};
  o.rank = 4;
  try {
    PlanGpt(o);
    FAIL() << "rank 4 of a world of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("planning rank 4 of a world of 4"), std::string::npos) << e.what();
  }
  o.rank = 0;
  o.pipeline_parallel_size = 4;
  try {
    PlanGpt(o);
    FAIL() << "2 layers on 4 stages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline_num_layers >= the stage count; got 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel::plan

namespace tessel::plan {
namespace {

CommTally Total(const GptPlan& plan, const std::string& group, const std::string& kind) {
  CommTally sum;
  for (const auto& [k, t] : plan.comm)
    if (k.group == group && k.kind == kind) {
      sum.count += t.count;
      sum.elements += t.elements;
      sum.bytes += t.bytes;
    }
  return sum;
}

// Sequence parallelism (Korthikanti et al., 2022): each tensor-parallel
// all-reduce of a layer becomes an all-gather before the column-parallel
// part and a reduce-scatter after the row-parallel part, of the same b*s*h
// activations: per layer 2 all-gathers and 2 reduce-scatters forward, and
// as many backward, plus (as in Megatron-LM, which keeps the gathered
// inputs split) 2 all-gathers recomputing them; no all-reduce.
TEST(GptPlan, SequenceParallelLayersAllGatherAndReduceScatterTheActivations) {
  GptPlanOptions o{.model = {.vocab_size = 50304, .hidden = 768, .heads = 12, .layers = 4, .max_seq = 1024},
                   .tensor_parallel_size = 4,
                   .micro_batch_size = 2,
                   .sequence_parallel = true};
  const int64_t bsh = 2 * 1024 * 768;
  for (int rank : {0, 3}) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    for (int64_t layer = 0; layer < 4; ++layer)
      for (bool backward : {false, true}) {
        SCOPED_TRACE("rank " + std::to_string(rank) + " layer " + std::to_string(layer) +
                     (backward ? " backward" : " forward"));
        // Backward also gathers the column-parallel inputs again (kept
        // split, as Megatron-LM keeps them): two all-gathers more.
        const int64_t gathers = backward ? 4 : 2;
        EXPECT_EQ(Tally(plan, layer, backward, "tp", "all-gather").count, gathers);
        EXPECT_EQ(Tally(plan, layer, backward, "tp", "all-gather").elements, gathers * bsh);
        EXPECT_EQ(Tally(plan, layer, backward, "tp", "reduce-scatter").count, 2);
        EXPECT_EQ(Tally(plan, layer, backward, "tp", "reduce-scatter").elements, 2 * bsh);
      }
    for (const auto& [k, t] : plan.comm) {
      if (k.layer >= 0) {
        EXPECT_TRUE(k.kind == "all-gather" || k.kind == "reduce-scatter") << k.kind;
      }
    }
  }
}

// All-to-all sequence parallelism (DeepSpeed-Ulysses, Jacobs et al.,
// 2023): the P ranks of a group split each sequence; per layer, q, k and v
// go from a split of the sequence to a split of the heads and the
// attention output comes back, four all-to-alls of N*h/P elements each
// for N tokens in forward (here q, k and v in one call: 3Nh/P and Nh/P)
// and the same in backward, and nothing else moves inside a layer. The
// group here is the data-parallel one; beside tensor parallelism the heads
// a tp rank owns are the ones split, so N*h/(dp*tp) each, and tp's own
// all-reduces are Megatron's for the rank's N/dp tokens. (The group shares
// its micro-batch's rows: N is micro_batch_size sequences.)
TEST(GptPlan, AllToAllSequenceParallelMovesFourTimesTheTokensHiddenStatesPerLayer) {
  for (const auto& [dp, tp] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 256, .heads = 8, .layers = 3, .max_seq = 128},
                     .tensor_parallel_size = tp,
                     .data_parallel_size = dp,
                     .micro_batch_size = 2};
    const GptPlan plain = PlanGpt(o);
    o.all_to_all_sequence_parallel = true;
    const int64_t tokens = o.micro_batch_size * 128;  // the dp group's micro-batch: its rows are shared
    for (int rank : {0, static_cast<int>(dp * tp - 1)}) {
      o.rank = rank;
      const GptPlan plan = PlanGpt(o);
      for (int64_t layer = 0; layer < 3; ++layer)
        for (bool backward : {false, true}) {
          SCOPED_TRACE("dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " rank " +
                       std::to_string(rank) + " layer " + std::to_string(layer) +
                       (backward ? " backward" : " forward"));
          const CommTally a2a = Tally(plan, layer, backward, "dp", "all-to-all");
          EXPECT_EQ(a2a.count, 2);
          EXPECT_EQ(a2a.elements, 4 * tokens * 256 / (dp * tp));
          // Each rank holds 1/dp of the tokens a plain dp rank holds.
          EXPECT_EQ(dp * Tally(plan, layer, backward, "tp", "all-reduce").elements,
                    Tally(plain, layer, backward, "tp", "all-reduce").elements);
          for (const auto& [k, t] : plan.comm) {
            if (k.layer == layer && k.backward == backward) {
              EXPECT_TRUE((k.group == "dp" && k.kind == "all-to-all") ||
                          (k.group == "tp" && k.kind == "all-reduce"))
                  << k.group << " " << k.kind;
            }
          }
        }
      // The gradients are reduced over dp as without it.
      EXPECT_EQ(Total(plan, "dp", "all-reduce").bytes, Total(plain, "dp", "all-reduce").bytes);
    }
  }
}

// ZeRO stage 1 (Rajbhandari et al., 2020) moves what data parallelism
// moves: the gradients reduce-scattered and the updated parameters
// all-gathered, each the rank's parameter bytes, where plain data
// parallelism all-reduces them once. What ZeRO leaves whole (a
// column-parallel bias, split over tp on its only dimension) is still
// all-reduced, and the gradient norm, summed over the shards, adds one
// f32 scalar.
TEST(GptPlan, ZeroStageOneReduceScattersGradientsAndAllGathersParameters) {
  GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 128, .heads = 4, .layers = 3, .max_seq = 64},
                   .tensor_parallel_size = 2,
                   .data_parallel_size = 2,
                   .micro_batch_size = 2,
                   .micro_batches = 4};
  const GptPlan plain = PlanGpt(o);
  o.zero_stage = 1;
  for (int rank = 0; rank < 4; ++rank) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    SCOPED_TRACE("rank " + std::to_string(rank));
    const CommTally scatter = Total(plan, "dp", "reduce-scatter"), gather = Total(plan, "dp", "all-gather");
    const CommTally reduce = Total(plan, "dp", "all-reduce");
    EXPECT_EQ(scatter.bytes, gather.bytes);
    EXPECT_EQ(scatter.bytes + reduce.bytes, Total(plain, "dp", "all-reduce").bytes + 4);
    EXPECT_GT(static_cast<double>(scatter.bytes), 0.99 * static_cast<double>(plan.parameter_bytes));
  }
}

}  // namespace
}  // namespace tessel::plan

namespace tessel::plan {
namespace {

// Activation memory per transformer layer with and without sequence
// parallelism, against the ratio Korthikanti et al. (2022) publish:
// (34/t + 5as/(ht)) / (10 + 24/t + 5as/(ht)) per layer. tessel keeps f32
// activations and no dropout masks, so the bytes differ from the paper's;
// the fraction sequence parallelism removes is what is compared (within
// 5%). A layer's activations are the planned peak's growth per two layers.
TEST(GptPlan, SequenceParallelCutsLayerActivationsByThePublishedRatio) {
  const int64_t h = 768, a = 12, s = 1024;
  for (int64_t t : {2, 4}) {
    auto per_layer = [&](bool sequence_parallel) {
      auto peak = [&](int64_t layers) {
        GptPlanOptions o{
            .model = {.vocab_size = 50304, .hidden = h, .heads = a, .layers = layers, .max_seq = s},
            .tensor_parallel_size = t,
            .micro_batch_size = 2,
            .sequence_parallel = sequence_parallel};
        return static_cast<double>(PlanGpt(o).plan.memory().peak_activation_bytes());
      };
      return (peak(4) - peak(2)) / 2;
    };
    const double measured = per_layer(true) / per_layer(false);
    const double attention = 5.0 * a * s / (h * t);
    const double published = (34.0 / t + attention) / (10.0 + 24.0 / t + attention);
    EXPECT_NEAR(measured, published, 0.05 * published) << "tp " << t;
    std::printf(
        "tp %ld: a layer's activations with sequence parallelism are %.3f of those without (published "
        "%.3f)\n",
        static_cast<long>(t), measured, published);
  }
}

// The multi-axis tensor-parallel modes against their papers' per-layer
// communication (each rank's buffers, per micro-batch; b sequences per
// data-parallel rank, s tokens, hidden h, feed-forward f = 4h; the four
// linears of a layer have h x 3h, h x h, h x f and f x h weights, so they
// hold 4h^2 + 2hf weights and read 3h + f input features per token):
//   2d (Optimus' SUMMA on q x q, groups tp0 along a mesh column and tp1
//   along a row): forward each linear all-gathers its weight's q blocks
//   down the column ((4h^2 + 2hf)/q in all) and its input across the row
//   ((b/q) s (3h + f)); backward reduce-scatters the same buffers. Layer
//   norms all-reduce 2 row statistics ((b/q) s each) forward and backward.
//   2.5d (Tesseract, d x q x q: tp0 the depth): the same with the batch
//   split d q ways, and the weight gradients all-reduced over the depth
//   ((4h^2 + 2hf)/q^2).
//   3d (the cube, each linear: input gathered along one axis, weight along
//   another, product reduce-scattered along the third; backward the
//   reverse): inputs b s h_in/q^2, weights h_in h_out/q^2, products
//   b s h_out/q^2; tessel's hidden states keep the sequence split (not a
//   second batch split), so attention gathers keys and values, b s 2h/q^2.
struct LayerComm {
  int64_t count = 0, elements = 0;
  bool operator==(const LayerComm&) const = default;
};
using LayerComms = std::map<std::tuple<bool, std::string, std::string>, LayerComm>;

LayerComms PlannedLayerComms(const GptPlan& plan, int64_t layer) {
  LayerComms out;
  for (const auto& [k, t] : plan.comm)
    if (k.layer == layer) out[{k.backward, k.group, k.kind}] = {t.count, t.elements};
  return out;
}

std::string Describe(const LayerComms& comms) {
  std::string s;
  for (const auto& [k, v] : comms)
    s += std::string(std::get<0>(k) ? "backward " : "forward ") + std::get<1>(k) + " " + std::get<2>(k) +
         ": " + std::to_string(v.count) + " x, " + std::to_string(v.elements) + " elements\n";
  return s;
}

TEST(GptPlan, MultiAxisTensorParallelLayersMoveWhatTheirPapersSay) {
  struct Case {
    std::string mode;
    int64_t q, depth, dp, h, heads, b, s;
  };
  for (const Case& c : {Case{"2d", 2, 1, 1, 64, 4, 4, 32}, Case{"2d", 3, 1, 1, 96, 6, 6, 24},
                        Case{"2d", 2, 1, 2, 64, 4, 4, 32}, Case{"2.5d", 2, 2, 1, 64, 4, 8, 32},
                        Case{"3d", 2, 1, 1, 64, 4, 4, 32}, Case{"3d", 3, 1, 1, 96, 6, 6, 27}}) {
    const int64_t q = c.q, h = c.h, f = 4 * h, b = c.b, s = c.s;
    const int64_t tp = c.mode == "3d" ? q * q * q : c.depth * q * q;
    GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = h, .heads = c.heads, .layers = 2, .max_seq = s},
                     .tensor_parallel_size = tp,
                     .data_parallel_size = c.dp,
                     .micro_batch_size = b,
                     .tensor_parallel_mode = c.mode};
    if (c.mode == "2.5d") o.tensor_parallel_mode_options = {{"depth", std::to_string(c.depth)}};
    const int64_t weights = 4 * h * h + 2 * h * f, features = 3 * h + f;
    LayerComms want;
    if (c.mode == "3d") {
      const int64_t col_in = b * s * 2 * h / (q * q), col_out = b * s * features / (q * q);
      const int64_t row_in_and_kv = b * s * features / (q * q), row_out = b * s * 2 * h / (q * q);
      const int64_t stats = 4 * (b / q) * (s / q);
      for (bool backward : {false, true}) {
        const char* gather = backward ? "reduce-scatter" : "all-gather";
        const char* scatter = backward ? "all-gather" : "reduce-scatter";
        want[{backward, "tp1", gather}] = {2, col_in};
        want[{backward, "tp0", gather}] = {4, row_in_and_kv};
        want[{backward, "tp2", gather}] = {4, weights / (q * q)};
        want[{backward, "tp0", scatter}] = {2, col_out};
        want[{backward, "tp1", scatter}] = {2, row_out};
        want[{backward, "tp0", "all-reduce"}] = {4, stats};
      }
    } else {
      // 2d's [rows, columns] are 2.5d's tp1, tp2 (tp0 its depth).
      const std::string rows = c.mode == "2d" ? "tp0" : "tp1", columns = c.mode == "2d" ? "tp1" : "tp2";
      const int64_t batch = b / (c.depth * q);
      for (bool backward : {false, true}) {
        const char* kind = backward ? "reduce-scatter" : "all-gather";
        want[{backward, rows, kind}] = {4, weights / q};
        want[{backward, columns, kind}] = {4, batch * s * features};
        want[{backward, columns, "all-reduce"}] = {4, 4 * batch * s};
      }
      if (c.mode == "2.5d") want[{true, "tp0", "all-reduce"}] = {4, weights / (q * q)};
    }
    for (int rank : {0, static_cast<int>(c.dp * tp - 1)}) {
      o.rank = rank;
      const GptPlan plan = PlanGpt(o);
      for (int64_t layer = 0; layer < 2; ++layer) {
        const LayerComms got = PlannedLayerComms(plan, layer);
        EXPECT_EQ(got, want) << c.mode << " q " << q << " dp " << c.dp << " rank " << rank << " layer "
                             << layer << "\nplanned:\n"
                             << Describe(got) << "expected:\n"
                             << Describe(want);
      }
    }
  }
}

// Memory per stage follows the schedule: a stage keeps the activations of
// the micro-batches it holds at once, and the plan walks its ops in the
// runtime's order, so the published multiples come out of the plan.
TEST(GptPlan, ActivationsPerStageFollowTheMicroBatchesTheScheduleHolds) {
  GptPlanOptions o{.model = {.vocab_size = 1024, .hidden = 256, .heads = 4, .layers = 8, .max_seq = 128},
                   .tensor_parallel_size = 2,
                   .pipeline_parallel_size = 4,
                   .micro_batch_size = 1,
                   .micro_batches = 8};
  auto stages_under = [&](const std::string& schedule, int64_t chunks = 1) {
    GptPlanOptions with = o;
    with.schedule = schedule;
    with.virtual_pipeline_size = chunks;
    return PlanGpt(with).stages;
  };
  const std::vector<StageMemory> one_f_one_b = stages_under("1f1b"), gpipe = stages_under("gpipe"),
                                 zero_bubble = stages_under("zb_h1"),
                                 interleaved = stages_under("interleaved_1f1b", 2);
  ASSERT_EQ(one_f_one_b.size(), 4u);
  for (int s = 0; s < 4; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    EXPECT_EQ(one_f_one_b[s].rank, 2 * s);
    EXPECT_EQ(one_f_one_b[s].in_flight, 4 - s);  // min(p - s, m)
    EXPECT_EQ(gpipe[s].in_flight, 8);
    // Parameters and AdamW state do not depend on the schedule.
    EXPECT_EQ(gpipe[s].variable_bytes, one_f_one_b[s].variable_bytes);
    // GPipe keeps all m micro-batches where 1F1B keeps p - s (the last
    // stage's loss and logits aside, which neither keeps for long).
    if (s < 3) {
      const double ratio = static_cast<double>(gpipe[s].activation_bytes) / one_f_one_b[s].activation_bytes;
      EXPECT_NEAR(ratio, 8.0 / (4 - s), 0.1 * 8.0 / (4 - s));
    }
  }
  // Interleaving v = 2 chunks: the first stage holds
  // 1 + (p - 1) / (p v) times 1F1B's activations (Narayanan et al.;
  // Korthikanti et al., section 4.2.3).
  EXPECT_EQ(interleaved[0].in_flight, 2 * 3 + 4 + 1);  // 2 (p - 1) + (v - 1) p warm-up chunks, then one more
  const double interleaving =
      static_cast<double>(interleaved[0].activation_bytes) / one_f_one_b[0].activation_bytes;
  EXPECT_NEAR(interleaving, 1 + 3.0 / 8, 0.05);
  // ZB-H1 keeps at most what 1F1B keeps on its first stage (Qi et al.):
  // deferred weight gradients hold only the inputs they read.
  int64_t most_1f1b = 0, most_zero_bubble = 0;
  for (int s = 0; s < 4; ++s) {
    most_1f1b = std::max(most_1f1b, one_f_one_b[s].activation_bytes);
    most_zero_bubble = std::max(most_zero_bubble, zero_bubble[s].activation_bytes);
    EXPECT_GE(zero_bubble[s].activation_bytes, one_f_one_b[s].activation_bytes) << "stage " << s;
  }
  EXPECT_LE(most_zero_bubble, most_1f1b);
  // bf16: every value of forward and backward takes half the bytes; the
  // model's bf16 copies add half the f32 parameters to the variables.
  GptPlanOptions bf16 = o;
  bf16.precision = GptPlanOptions::Precision::kBf16;
  const GptPlan half = PlanGpt(bf16);
  EXPECT_NEAR(static_cast<double>(half.stages[1].activation_bytes) / one_f_one_b[1].activation_bytes, 0.5,
              0.02);
  EXPECT_EQ(half.stages[0].variable_bytes, one_f_one_b[0].variable_bytes + half.parameter_bytes / 2);
}

TEST(GptPlan, MemorySizesParseWithTheirUnits) {
  EXPECT_EQ(ParseByteSize("80GiB"), int64_t{80} << 30);
  EXPECT_EQ(ParseByteSize("80 GiB"), int64_t{80} << 30);
  EXPECT_EQ(ParseByteSize("40GB"), int64_t{40000000000});
  EXPECT_EQ(ParseByteSize("1.5TiB"), int64_t{3} << 39);
  EXPECT_EQ(ParseByteSize("4096"), 4096);
  for (const char* bad : {"", "GiB", "-1GiB", "80 gigs", "nan", "1e30GiB"}) {
    EXPECT_THROW(ParseByteSize(bad), Error) << bad;
  }
}

// The pipeline played with unit times gives the published step times:
// (m + p - 1)(t_F + t_B) for GPipe and 1F1B, (3m + p - 1) t under ZB-H1
// with F, B and W of one t each, and (m v + p - 1)(t_F + t_B) / v
// interleaved over v chunks (each chunk 1/v of a stage's work).
TEST(StepEstimate, PlayingThePipelineGivesThePublishedStepTimes) {
  auto play = [](const std::string& schedule, int p, int m, int v, double forward, double backward,
                 double weight) {
    std::vector<StageTimes> stages(p);
    for (int s = 0; s < p; ++s) {
      stages[s].stage = s;
      stages[s].actions = runtime::StageActions(schedule, p, s, m, v);
      for (const runtime::Action& a : stages[s].actions)
        stages[s].unit_s[{a.chunk, a.micro_batch,
                          a.weight     ? 2
                          : a.backward ? 1
                                       : 0}] = (a.weight     ? weight
                                                : a.backward ? backward
                                                             : forward) /
                                               v;
    }
    return PlayPipeline(stages, m, v);
  };
  for (int p : {1, 2, 4}) {
    for (int m : {4, 8}) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      EXPECT_NEAR(play("gpipe", p, m, 1, 1, 2, 0).step_s, (m + p - 1) * 3.0, 1e-9);
      EXPECT_NEAR(play("1f1b", p, m, 1, 1, 2, 0).step_s, (m + p - 1) * 3.0, 1e-9);
      EXPECT_NEAR(play("zb_h1", p, m, 1, 1, 1, 1).step_s, 3.0 * m + p - 1, 1e-9);
      if (p > 1 && m % p == 0) {
        EXPECT_NEAR(play("interleaved_1f1b", p, m, 2, 1, 2, 0).step_s, (m * 2 + p - 1) * 3.0 / 2, 1e-9);
      }
      const StepEstimate e = play("1f1b", p, m, 1, 1, 2, 0);
      EXPECT_NEAR(e.busy_s, 3.0 * m, 1e-9);  // each stage's own work; the rest is the bubble
    }
  }
}

TEST(StepEstimate, MatmulThroughputIsInterpolatedBetweenMeasuredSizes) {
  MachineModel machine;
  machine.gemm = {{1e6, 1e9}, {1e8, 1e10}};
  EXPECT_DOUBLE_EQ(machine.GemmSeconds(1e5), 1e5 / 1e9);                      // below: the smallest's rate
  EXPECT_DOUBLE_EQ(machine.GemmSeconds(1e9), 1e9 / 1e10);                     // above: the largest's
  EXPECT_NEAR(machine.GemmSeconds(1e7), 1e7 / std::sqrt(1e9 * 1e10), 1e-12);  // log-linear between
  EXPECT_EQ(machine.GemmSeconds(0), 0);
}

}  // namespace
}  // namespace tessel::plan

namespace tessel::plan {
namespace {

// Llama with grouped-query attention (8 query heads on 2 key/value heads)
// under dp2 x tp2 with 2 micro-batches: Megatron-LM's activation
// all-reduces (two b*s*h each way per layer and micro-batch: q|k|v and
// gate|up are one projection each, so their input gradients are reduced
// once), and a data-parallel gradient all-reduce of the rank's parameters,
// whose key and value projections are kv_heads x head_dim wide (2 x 32
// here, a quarter of q's).
TEST(GptPlan, LlamaMovesMegatronsActivationsAndGroupedQueryAttentionsSmallerGradients) {
  const int64_t h = 256, heads = 8, kv_heads = 2, ffn = 704, vocab = 1024, seq = 64, layers = 2;
  const int64_t tp = 2, dp = 2, b = 2, m = 2;
  GptPlanOptions o{.llama = models::LlamaConfig{.vocab_size = vocab,
                                                .hidden = h,
                                                .heads = heads,
                                                .kv_heads = kv_heads,
                                                .layers = layers,
                                                .ffn_hidden = ffn,
                                                .max_seq = seq},
                   .tensor_parallel_size = tp,
                   .data_parallel_size = dp,
                   .micro_batch_size = b,
                   .micro_batches = m};
  const int64_t kv = kv_heads * (h / heads);
  // Per layer, the rank's shards: q|k|v, o, gate|up and down split over tp;
  // the two RMSNorm weights whole. Outside: embedding and output tables
  // split on the vocabulary, the final norm.
  const int64_t layer_params = (h * (h + 2 * kv) + h * h + 3 * h * ffn) / tp + 2 * h;
  const int64_t params = layers * layer_params + 2 * vocab * h / tp + h;
  for (int rank : {0, 3}) {
    o.rank = rank;
    const GptPlan plan = PlanGpt(o);
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(plan.parameter_bytes, params * 4);
    EXPECT_EQ(Tally(plan, -1, true, "dp", "all-reduce").bytes, plan.parameter_bytes);
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (bool backward : {false, true}) {
        SCOPED_TRACE(std::to_string(layer) + (backward ? " backward" : " forward"));
        const CommTally t = Tally(plan, layer, backward, "tp", "all-reduce");
        EXPECT_EQ(t.count, 2 * m);
        EXPECT_EQ(t.elements, 2 * m * b * seq * h);
      }
    }
    for (const auto& [k, t] : plan.comm) {
      if (k.layer >= 0) {
        EXPECT_TRUE(k.group == "tp" && k.kind == "all-reduce") << k.group << " " << k.kind;
      }
    }
  }
}

}  // namespace
}  // namespace tessel::plan
