// What one rank of a GPT (or Llama) training job would run, communicate and hold,
// compiled without the job: the model, AdamW and the training step are
// built and traced metadata-only for the job's world (graph/ir/meta.h),
// compiled by the same passes graph mode uses, and the rank's physical
// plan is compiled from the result (graph/plan/rank_plan.h). Memory is
// planned per pipeline stage in the order the actor runtime runs the
// stage's ops under the chosen schedule (runtime/rank_schedule.h), so the
// micro-batches a schedule keeps in flight are counted. tessel-plan prints
// it; tests check it against the published communication and activation
// formulas.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/plan/rank_plan.pb.h"
#include "layers/dist.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "tools/plan/step_estimate.h"
#include "zoo/config.pb.h"

namespace tessel::plan {

struct GptPlanOptions {
  models::GPTConfig model = {};                             // the GPT that is planned, unless `llama` is set
  std::optional<models::LlamaConfig> llama = std::nullopt;  // set: this Llama is planned instead
  // Tensor, pipeline and data-parallel sizes; the world is their product.
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t data_parallel_size = 1;
  // Model chunks per stage (dist::Config::virtual_pipeline_size): an
  // interleaved 1F1B pipeline.
  int64_t virtual_pipeline_size = 1;
  int rank = 0;
  int64_t micro_batch_size = 1;    // sequences per micro-batch on each data-parallel rank
  int64_t micro_batches = 1;       // gradient accumulation steps (pipeline micro-batches)
  int64_t seq = 0;                 // tokens per sequence; 0: model.max_seq
  bool want_dot = false;           // keep the compiled logical graph as Graphviz
  bool want_instructions = false;  // keep the rank's executable plan in words
  bool sequence_parallel = false;  // dist::Config::sequence_parallel
  // dist::Config::all_to_all_sequence_parallel: the data-parallel ranks
  // share micro_batch_size rows and split each sequence.
  bool all_to_all_sequence_parallel = false;
  // dist::Config::context_parallel: split the same way; each attention
  // gathers the keys and values.
  bool context_parallel = false;
  int64_t zero_stage = 0;  // dist::Config::zero_stage (and AdamW's)
  // dist::Config::tensor_parallel_mode and its options (e.g. 2.5d's depth).
  std::string tensor_parallel_mode = "1d";
  std::map<std::string, std::string> tensor_parallel_mode_options = {};
  // The pipeline schedule memory is planned under (runtime/
  // pipeline_schedule.h), or "in_order" (graph mode's reference executor).
  std::string schedule = "1f1b";
  // kBf16: mixed precision as tessel-train's train.amp runs it — forward
  // and backward compute in bf16 (2 bytes an element), the model keeps a
  // bf16 copy of each parameter beside the f32 masters the optimizer
  // updates (whose AdamW state stays f32).
  enum class Precision { kF32, kBf16 };
  Precision precision = Precision::kF32;
  // When > 0: the device memory each rank has, for the verdict.
  int64_t device_memory_bytes = 0;
  // When set: the step time is estimated on this machine (not under
  // in_order).
  const MachineModel* machine = nullptr;
};

// What a rank of one pipeline stage holds at once under the schedule.
struct StageMemory {
  int stage = 0;
  int rank = 0;  // the rank planned: the one of this stage at --rank's place in the [dp, tp] grid
  // The most micro-batches whose activations the stage holds at once (a
  // micro-batch held by two chunks counts twice); -1 under in_order.
  int in_flight = -1;
  int64_t variable_bytes = 0;    // parameters and AdamW state (with bf16: the bf16 copies too)
  int64_t activation_bytes = 0;  // the most activations alive at once
  // The most op results alive at once (activations, gradients, the
  // optimizer's temporaries, a kernel's declared workspace).
  int64_t peak_bytes = 0;
  int64_t input_bytes = 0;  // the batch
  int64_t total_bytes() const { return variable_bytes + input_bytes + peak_bytes; }
};

// The parallel group a communication runs in, seen from the job's layout
// (world = pp x dp x tp, tp innermost): "tp" (one stage, one data-parallel
// index), "dp" (one stage, one tensor-parallel index), "pp" (a send or
// receive to another stage), else "other". Under the multi-axis tensor
// modes a group along one axis of the tensor mesh is "tp0", "tp1" or
// "tp2" (2d: [rows, columns]; 2.5d: [depth, rows, columns]; 3d: the cube's
// three axes), and "tp" spans several.
struct CommKey {
  int64_t layer = -1;  // the transformer layer (ir::Op::layer); -1: outside every layer
  bool backward = false;
  std::string group;
  std::string kind;  // all-reduce, send, recv, ...
  auto operator<=>(const CommKey&) const = default;
};
struct CommTally {
  int64_t count = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
};

struct GptPlan {
  int world_size = 0;
  int stage = 0;  // the rank's pipeline stage
  proto::RankPlanProto plan;
  std::string instructions;           // with want_instructions: ExecPlan::ToText
  std::map<CommKey, CommTally> comm;  // the rank's communication per step
  int64_t logical_ops = 0;            // ops of the compiled logical graph
  int64_t parameter_bytes = 0;        // the rank's shards of the parameters
  double compile_seconds = 0;         // build, trace and compile the logical graph
  double rank_plan_seconds = 0;       // compile the rank's plan from it
  // Idle fraction of a stage under GPipe and 1F1B with equal stages,
  // (p - 1) / (m + p - 1).
  double bubble_fraction = 0;
  std::string dot;                  // with want_dot
  std::vector<StageMemory> stages;  // one rank of each stage, in stage order
  // With options.machine: each stage's ops timed, and the step played.
  std::vector<StageTimes> stage_times;
  StepEstimate estimate;
};

// Throws (naming the value) on sizes that do not fit: a rank outside the
// world, layers fewer than stages, heads or vocabulary tp does not divide,
// an unknown schedule.
GptPlan PlanGpt(const GptPlanOptions& options);

// The plan of the job a training config describes (model, layout, batch
// sizes, schedule, recomputation, ZeRO, mixed precision) on `world_size`
// ranks; throws naming the field on a config tessel-train would refuse or
// a model other than GPT-2 or Llama.
GptPlanOptions GptPlanOptionsFromConfig(const config::Config& config, int world_size);

// "80GiB", "40 GB", "512MiB", "1.5TiB" or a number of bytes; throws naming
// the text.
int64_t ParseByteSize(const std::string& text);

// The per-layer table, the totals by group and the pipeline line, as
// tessel-plan prints them.
std::string GptPlanText(const GptPlanOptions& options, const GptPlan& plan);

}  // namespace tessel::plan
