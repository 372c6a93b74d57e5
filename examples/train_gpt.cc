// A small GPT (2 layers, hidden 64, 4 heads, vocab 1000, sequence 32; the
// sizes are flags)
// trained for --steps steps on synthetic next-token data, under the layout
// the launch gives: world = pp x dp x tp (e.g. 4 ranks with --tp 2 is dp 2 x
// tp 2). Eagerly by default; with --graph the step (forward, backward,
// clipping, AdamW) is captured once as a graph and that runs. With
// --micro_batches each step accumulates gradients over that many parts of
// its batch. The losses depend neither on the layout, nor on the mode, nor
// on the micro-batch count. In graph mode the actor runtime runs the step
// with the --schedule pipeline schedule (1F1B by default).
//
//   tessel-launch --nproc_per_node 4 -- train_gpt --tp 2 [--graph] [--micro_batches 4]
//   tessel-launch --nproc_per_node 4 -- train_gpt --pp 4 --layers 4 --graph --micro_batches 8
//       --schedule gpipe --timeline_dir timelines --print_actions
//   tessel-launch --nproc_per_node 2 -- train_gpt --pp 2 --virtual_pipeline_size 2 --layers 4 --graph
//       --micro_batches 4 --schedule interleaved_1f1b
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/comm_trace.h"
#include "graph/boxing_executor.h"
#include "graph/plan/graph.h"
#include "graph/sbp_inference.h"
#include "layers/optimizer.h"
#include "models/gpt.h"
#include "runtime/actor_runtime.h"

DEFINE_int64(tp, 1, "tensor parallel size (dp is derived)");
DEFINE_int64(pp, 1, "pipeline parallel size: layers spread over stages, run one after another");
DEFINE_int64(steps, 20, "training steps");
DEFINE_int64(layers, 2, "transformer layers (at least --pp x --virtual_pipeline_size)");
DEFINE_int64(
    virtual_pipeline_size, 1,
    "model chunks per pipeline stage: the layers split into pp x this many parts, part j on stage j mod "
    "pp (run with --schedule interleaved_1f1b; --micro_batches a multiple of --pp)");
DEFINE_string(stage_ids, "",
              "the pipeline stage of each layer, comma-separated (e.g. 0,0,0,1 for 4 layers on 2 stages; the "
              "virtual stage 0..pp x virtual_pipeline_size - 1 with chunks); "
              "empty: the layers are split evenly, earlier stages taking one more when they do not divide");
DEFINE_int64(batch, 8, "sequences per step");
DEFINE_int64(hidden, 64, "hidden size (heavier layers make a pipeline's compute outweigh its transfers)");
DEFINE_int64(heads, 4, "attention heads");
DEFINE_int64(seq, 32, "tokens per sequence");
DEFINE_double(lr, 3e-3, "peak learning rate (warmup 3 steps, then cosine)");
DEFINE_int32(
    micro_batches, 1,
    "gradient accumulation: cut each step's batch into this many micro-batches, run forward and "
    "backward on each and update once with the averaged gradients (the same step as the whole batch, "
    "in a micro-batch's activation memory); --batch must divide by it");
DEFINE_bool(graph, false,
            "graph mode: capture the training step (forward, backward, clipping, AdamW) once and run the "
            "captured graph at every step");
DEFINE_string(
    schedule, "1f1b",
    "with --graph, how the captured step runs: 1f1b, gpipe (also: naive), zb_h1 or interleaved_1f1b on "
    "the actor runtime "
    "(communication on its own thread, each pipeline stage in the schedule's order), or in_order "
    "(the reference executor: one op after another in program order)");
DEFINE_int32(max_pending_sends, 0,
             "actor runtime: how many stage transfers a rank may have waiting for their receivers at once "
             "(a send beyond it waits: back-pressure between stages); 0: the schedule's bound (twice the "
             "most micro-batches a stage holds); -1: no bound");
DEFINE_string(timeline_dir, "",
              "with --graph on the actor runtime: write each rank's timeline of the last step there "
              "(timeline_rank<r>.json, Chrome trace; tools/pipeline_timeline.py draws the pipeline)");
DEFINE_bool(
    print_actions, false,
    "with --graph on the actor runtime: print each rank's order of micro-batch forwards and backwards "
    "(F0 F1 B0 ...) and the most micro-batches it held at once, at every step");
DEFINE_bool(activation_checkpoint, false,
            "with --graph: recompute each transformer layer in backward instead of keeping its activations "
            "(less memory, one more forward of each layer per step)");
DEFINE_int64(
    report_memory_every, 0,
    "every this many steps, print rank 0's resident memory and the dispatch caches' sizes (0: never)");
DEFINE_bool(
    comm_trace, false,
    "print, per step and rank, the collectives and transfers the step issued (op, group, calls, bytes)");

using namespace tessel;

namespace {
int64_t ResidentKiB() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * 4;  // 4 KiB pages
}

// Learnable synthetic data: each sequence walks the vocabulary with a fixed
// stride from a random start; the label is the next token.
void MakeBatch(int64_t step, int64_t batch, int64_t seq, int64_t vocab, Tensor* ids, Tensor* labels) {
  std::vector<int64_t> x(batch * seq), y(batch * seq);
  Philox gen(7);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t start = static_cast<int64_t>(gen.Uniform(static_cast<uint64_t>(step * batch + b)) * vocab);
    for (int64_t t = 0; t < seq; ++t) {
      x[b * seq + t] = (start + 7 * t) % vocab;
      y[b * seq + t] = (start + 7 * (t + 1)) % vocab;
    }
  }
  *ids = Tensor::FromVector<int64_t>(x, {batch, seq});
  *labels = Tensor::FromVector<int64_t>(y, {batch, seq});
}
// --stage_ids: "0,0,1" -> {0, 0, 1}.
std::vector<int64_t> StageIds(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSEL_CHECK(!item.empty() && used == item.size())
        << "--stage_ids='" << text << "': '" << item
        << "' is not an integer; expected stage ids like 0,0,1,1";
    ids.push_back(id);
  }
  return ids;
}
}  // namespace

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  models::GPTConfig config;
  TESSEL_CHECK(!FLAGS_activation_checkpoint || FLAGS_graph)
      << "--activation_checkpoint recomputes layers in a captured step; it needs --graph";
  config.activation_checkpoint = FLAGS_activation_checkpoint;
  config.layers = FLAGS_layers;
  config.hidden = FLAGS_hidden;
  config.heads = FLAGS_heads;
  config.max_seq = FLAGS_seq;
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = config.layers,
               .virtual_pipeline_size = FLAGS_virtual_pipeline_size,
               .custom_pipeline_stage_ids = StageIds(FLAGS_stage_ids)});
  if (dist::Rank() == 0)
    for (const std::string& line : dist::LayoutLines()) LOG(INFO) << line;
  models::GPT gpt(config);
  auto params = gpt.NamedParameters();
  optim::AdamW adamw(params, {.lr = FLAGS_lr, .weight_decay = 0.01});
  TESSEL_CHECK(FLAGS_micro_batches >= 1 && FLAGS_batch % FLAGS_micro_batches == 0)
      << "--micro_batches is " << FLAGS_micro_batches << " and --batch " << FLAGS_batch
      << "; expected a count of 1 or more that divides the batch";
  const bool in_order = FLAGS_schedule == "in_order";
  runtime::ActorRuntime actors({.schedule = in_order ? "1f1b" : runtime::ParseSchedule(FLAGS_schedule),
                                .max_pending_sends = FLAGS_max_pending_sends,
                                .timeline_dir = FLAGS_timeline_dir});
  // The same step as a graph: traced at the first call, run at every call.
  Graph train_step("train_step",
                   [&](const Graph::Tensors& in) { return models::TrainStep(gpt, params, adamw, in); },
                   {.micro_batches = FLAGS_micro_batches,
                    .stage_ranks = dist::StageRanks(),
                    .layer_stages = dist::LayerStages(),
                    .executor = in_order ? nullptr : actors.Executor()});
  if (FLAGS_comm_trace) comm::CommTrace::Get().Start();
  auto start = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    Tensor ids, labels;
    MakeBatch(step, FLAGS_batch, config.max_seq, config.vocab_size, &ids, &labels);
    adamw.set_lr(optim::WarmupCosineLr(step, FLAGS_lr, 3, FLAGS_steps));
    Tensor loss, norm;
    double grad_norm = 0;
    if (FLAGS_graph) {
      Graph::Tensors out = train_step({{"ids", ids}, {"labels", labels}});
      loss = out.at("loss");
      norm = out.at("grad_norm");  // read with the loss below, in one all-reduce
      if (FLAGS_print_actions && !in_order) {
        const runtime::StepReport& r = actors.last_step();
        std::printf(
            "step %ld rank %d stage %d actions %s in_flight %d peak_bytes %ld pending_sends %d send_quota "
            "%d\n",
            static_cast<long>(step), r.rank, r.stage, runtime::ActionsText(r.actions).c_str(),
            r.max_in_flight, static_cast<long>(r.peak_bytes), r.max_pending_sends, r.send_quota);
        std::fflush(stdout);
      }
    } else {
      // Eagerly, micro-batches are a loop: each backward adds its share
      // (1/micro_batches of its mean loss) to the gradients.
      const int64_t n = FLAGS_micro_batches, rows = FLAGS_batch / n;
      for (int64_t k = 0; k < n; ++k) {
        Tensor part = gpt.Loss(n == 1 ? ids : fn::slice(ids, 0, k * rows, (k + 1) * rows),
                               n == 1 ? labels : fn::slice(labels, 0, k * rows, (k + 1) * rows));
        if (n > 1) part = fn::mul_scalar(part, 1.0 / static_cast<double>(n));
        part.backward();
        loss = k == 0 ? part.detach() : fn::add(loss, part.detach());
      }
      grad_norm = optim::ClipGradNorm(params, 1.0);
      adamw.Step();
    }
    double value = 0;
    if (norm.defined()) {
      const std::vector<double> scalars = optim::ScalarValues({loss, norm});
      value = scalars[0];
      grad_norm = scalars[1];
    } else {
      value = optim::ScalarValue(loss);
    }
    if (dist::Rank() == 0) {
      std::printf("step %ld loss %.7f grad_norm %.5f lr %.6f\n", static_cast<long>(step), value, grad_norm,
                  adamw.lr());
      std::fflush(stdout);
    }
    if (FLAGS_report_memory_every > 0 && (step + 1) % FLAGS_report_memory_every == 0 && dist::Rank() == 0) {
      std::printf("step %ld memory rss_kib %ld signatures %zu/%zu boxing_plans %zu/%zu\n",
                  static_cast<long>(step), static_cast<long>(ResidentKiB()), SignatureCacheSize(),
                  kSignatureCacheCapacity, BoxingPlanCacheSize(), kBoxingPlanCacheCapacity);
      std::fflush(stdout);
    }
    if (FLAGS_comm_trace) {
      std::printf("step %ld comm of rank %d:\n%s", static_cast<long>(step), dist::Rank(),
                  comm::CommTrace::Summarize(comm::CommTrace::Get().Take()).c_str());
      std::fflush(stdout);
    }
  }
  if (dist::Rank() == 0 && FLAGS_steps > 1) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%.1f ms per step\n", 1e3 * seconds / static_cast<double>(FLAGS_steps));
  }
  return 0;
}
