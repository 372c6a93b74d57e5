// What a parallelization policy decides for a model written for one device
// (nnScaler's idea, in tessel's terms): how many ranks form each pipeline
// stage's [data, tensor] grid, which stage each op of the model runs on, and
// how each parameter is split over the tensor-parallel axis. Everything else
// — the layouts of activations and gradients, the collectives, the
// transfers between stages — follows from signature inference, the same
// rule eager mode and the graph compiler use.
//
// A policy is a function over the model's traced graph (ir::Graph of the
// forward on one device). Built in (parallel/policies.cc): "dp", "tp",
// "pp", "hybrid", and "auto", which predicts every data x tensor x
// pipeline split and micro-batch count with the cost model
// (parallel/cost_model.h), keeps those within ComputeConfig::
// memory_limit_bytes, times the three splits predicted fastest for a few
// steps where it may (PolicyContext::measure) and prints what it weighed;
// a program registers more with RegisterPolicy.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/device.h"
#include "graph/ir/graph_ir.h"
#include "sbp/sbp.h"

namespace tessel::parallel {

struct ComputeConfig {
  // Ranks one copy of the plan spans (0: runtime_ranks).
  int plan_ranks = 0;
  // Ranks the job trains on (0: the world); a multiple of plan_ranks: the
  // plan is replicated data-parallel over runtime_ranks / plan_ranks copies.
  int runtime_ranks = 0;
  // ZeRO stage 1 over the data-parallel ranks (replicas included): AdamW's
  // moments, and an f32 shard of each parameter it updates, are split over
  // them; each gradient is reduce-scattered into its split and the updated
  // shards all-gathered back (layers/dist.h: ZeroShardSbp). parallelize
  // then sets the dist config (dist::Setup) to the plan's sizes, and
  // build_optimizer asks AdamW for stage 1.
  bool use_zero = false;
  // Gradient-accumulation micro-batches per step (0: the policy chooses;
  // pipelines need at least as many as stages to fill).
  int micro_batches = 0;
  // The sizes "hybrid" uses (their product is plan_ranks; 0: chosen).
  int data_parallel_size = 0, tensor_parallel_size = 0, pipeline_parallel_size = 0;
  // A registered pipeline schedule (runtime/pipeline_schedule.h).
  std::string schedule = "1f1b";
  // "auto": the most bytes a rank may hold (parameters, gradients, AdamW
  // moments, activations in flight); 0: no limit.
  int64_t memory_limit_bytes = 0;
  DeviceType device_type = DeviceType::kCPU;
};

struct ParallelPlan {
  std::string policy;
  // One plan copy: `stages` pipeline stages of data_parallel x
  // tensor_parallel ranks each.
  int64_t data_parallel = 1, tensor_parallel = 1, stages = 1;
  int micro_batches = 1;
  // Each parameter's entry on the tensor-parallel axis (S(d) or B; B when
  // absent). Over the data-parallel axis parameters are replicated.
  std::map<std::string, Sbp> parameter_split;
  // The stage of each op of the traced single-device forward (by op id).
  std::vector<int> op_stage;
  // What the policy decided and why, a line each (parallelize prints them).
  std::vector<std::string> reasons;
  // What it was made for (parallel/plan_file.h: ModelFingerprint); set by
  // parallelize and MakePlan.
  std::string model_fingerprint;

  int64_t ranks() const { return data_parallel * tensor_parallel * stages; }
  // The plan in a few lines: sizes, stages, splits, reasons.
  std::string ToText() const;
};

// What a policy is given.
struct PolicyContext {
  // The model's forward traced on one device (local values; parameters are
  // variables named as nn::Module::NamedParameters names them, inputs by
  // their batch names). Every op here needs a stage in the plan.
  const ir::Graph& graph;
  // The names of the parameters (variables of `graph` that are parameters).
  std::set<std::string> parameters;
  // With plan_ranks and runtime_ranks resolved.
  ComputeConfig config;
  // The forward traced again under a tentative plan (one plan copy, metadata
  // only: nothing runs), with the layouts signature inference gives every
  // value: what "tp" consults to split the weights. Throws what the trace
  // throws.
  std::function<std::unique_ptr<ir::Graph>(const ParallelPlan&)> trace;
  // Trains the model under a plan for a few steps on the sample batch (a
  // scratch layout with an optimizer that changes nothing; the model is
  // left as it was) and returns the mean step time in seconds, the same on
  // every rank (collective over the world). Null where nothing may run
  // (MakePlan).
  std::function<double(const ParallelPlan&)> measure;
};

using Policy = std::function<ParallelPlan(const PolicyContext&)>;

// Registers a policy by name (replacing one of the name); throws on an
// empty name or function.
void RegisterPolicy(const std::string& name, Policy policy);
// The registered policy; throws naming the registered ones if unknown.
const Policy& GetPolicy(const std::string& name);
std::vector<std::string> PolicyNames();

// The stage of each parameter and each input: that of the first op of
// `graph` reading it. What a plan puts where follows from its op stages.
std::map<std::string, int> FirstUseStages(const ir::Graph& graph, const std::vector<int>& op_stage);

// A plan of data x tensor x pipeline ranks: stages cut by SplitStages,
// weights split by ChooseTensorSplits, `micro_batches` per step (0: twice
// the stages where the batch allows, else the stages; 1 without stages).
ParallelPlan ComposePlan(const PolicyContext& context, const std::string& name, int64_t data, int64_t tensor,
                         int64_t pipeline, int micro_batches = 0);

// An op's work: a matmul's multiply-adds, or the elements any other op
// writes (what SplitStages balances and the cost model times).
struct OpWork {
  double multiply_adds = 0, elements = 0;
};
OpWork WorkOf(const ir::Graph& graph, const ir::Op& op);

// Building blocks of the built-in policies (parallel/stage_split.cc and
// parallel/tensor_split.cc), for programs writing their own.
//
// Cuts the forward into `stages` runs of ops of about equal cost (a
// matmul's multiply-adds, other ops their results' elements), each cut just
// before an op reading a parameter no earlier op read. Throws naming the
// count when the model has fewer such places than stages need.
std::vector<int> SplitStages(const ir::Graph& graph, const std::set<std::string>& parameters, int64_t stages,
                             std::vector<std::string>* reasons);
// Megatron's pattern found by signature inference: in program order, a
// weight of y = x W whose x arrives whole over tp is split on its output
// features (column), one whose x arrives split on its last dimension (a
// column layer's output) on its input features (row); a bias added to a
// column layer's output is split with it. A column split whose output
// inference has to gather before any row layer reads it (a layer norm in
// between, say) is undone, and that weight stays replicated. Sizes tp
// does not divide stay replicated. Consults context.trace.
std::map<std::string, Sbp> ChooseTensorSplits(const PolicyContext& context, ParallelPlan plan,
                                              std::vector<std::string>* reasons);

}  // namespace tessel::parallel
