// parallelize: a model written for one device, trained over many ranks by a
// policy, in the manner of nnScaler.
//
//   models::PlainGPT gpt(config);                 // plain layers, one device
//   auto pm = parallel::parallelize(gpt, sample_batch, "hybrid", {.plan_ranks = 4});
//   auto adamw = parallel::build_optimizer(*pm, {.lr = 1e-3});
//   for (...) { auto r = pm->TrainStep(batch, *adamw); LOG(INFO) << r.loss; }
//   auto whole = parallel::merge_state_dicts(*pm);  // loads into the one-device model
//
// parallelize traces the model's forward on the sample batch (graph/ir),
// hands the graph to the policy (parallel/plan.h), and lays the model's
// parameters out as the plan says: each on the stage of its first use, split
// over the tensor-parallel axis as the plan says and replicated over the
// data-parallel one. Training steps are traced and compiled in graph mode
// (forward, backward, gradient clipping, the optimizer) and run by the
// actor runtime with the plan's micro-batches and the config's pipeline
// schedule. The model's own code does not change: while its forward runs,
// an interpreter layer (parallel/stage_placer.h) moves activations to the
// stages that read them, and signature inference lays out the rest.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/plan/graph.h"
#include "layers/module.h"
#include "layers/optimizer.h"
#include "parallel/plan.h"
#include "runtime/actor_runtime.h"
#include "sbp/placement.h"

namespace tessel::parallel {

using Tensors = std::map<std::string, Tensor>;

class ParallelModule {
 public:
  ParallelModule(nn::LossModule& module, ParallelPlan plan, const ComputeConfig& config,
                 const Tensors& sample_inputs, const std::map<std::string, int>& first_use_stages);
  ParallelModule(const ParallelModule&) = delete;
  ParallelModule& operator=(const ParallelModule&) = delete;

  const ParallelPlan& plan() const { return plan_; }
  // With plan_ranks and runtime_ranks resolved.
  const ComputeConfig& config() const { return config_; }
  // Each stage's ranks as [data x replicas, tensor] (axes of size 1 dropped).
  const std::vector<Placement>& stage_placements() const { return stages_; }
  // The model's parameters, now global tensors in the plan's layouts.
  optim::NamedParams NamedParameters() { return module_.NamedParameters(); }

  // A batch whole on every rank (local tensors named as the sample's, of
  // its shapes and dtypes) in the plan's layouts: each input on the stage
  // that first reads it, its rows split over the data-parallel ranks.
  Tensors PlaceInputs(const Tensors& batch) const;
  // The loss of a batch, computed eagerly, on every rank.
  double Loss(const Tensors& batch);

  struct StepResult {
    double loss = 0, grad_norm = 0;
  };
  // One training step in graph mode: forward and backward over the plan's
  // micro-batches, the gradients clipped to `max_norm` (global norm), one
  // optimizer step. Every call must pass the same optimizer.
  StepResult TrainStep(const Tensors& batch, optim::AdamW& optimizer, double max_norm = 1.0);

 private:
  nn::LossModule& module_;
  ParallelPlan plan_;
  ComputeConfig config_;
  std::vector<Placement> stages_;
  std::map<std::string, int> input_stages_;
  std::map<std::string, ir::Value> input_specs_;  // the sample's (shape, dtype)
  std::unique_ptr<runtime::ActorRuntime> actors_;
  std::unique_ptr<Graph> step_;
  optim::AdamW* step_optimizer_ = nullptr;  // the one the step was captured with
  double step_max_norm_ = 0;
};

// Lays `module` (parameters local, as built for one device) out over the
// job's ranks by `policy` (a registered name or a function). The sample
// inputs are a batch of the shapes training will use (local tensors).
// Throws before anything moves, naming what is wrong: a sample batch the
// model refuses, a plan that leaves an op without a stage or sends data to
// an earlier stage, sizes that do not match the ranks.
std::unique_ptr<ParallelModule> parallelize(nn::LossModule& module, const Tensors& sample_inputs,
                                            const std::string& policy, const ComputeConfig& config = {});
std::unique_ptr<ParallelModule> parallelize(nn::LossModule& module, const Tensors& sample_inputs,
                                            const Policy& policy, const ComputeConfig& config = {});

// The plan `policy` makes for `module` on config.plan_ranks ranks, without
// laying anything out or running a step (the job's world need not have
// them): what parallelize would print and use ("auto" decides on its
// predictions alone here). In a job of several ranks "auto" measures its
// rates collectively, so every rank must call it.
ParallelPlan MakePlan(nn::LossModule& module, const Tensors& sample_inputs, const Policy& policy,
                      ComputeConfig config);

// An AdamW over the parallel module's parameters, in their layouts (ZeRO
// stage 1 under ComputeConfig::use_zero).
std::unique_ptr<optim::AdamW> build_optimizer(ParallelModule& module, const optim::AdamWConfig& config = {});

// Every parameter whole, as a local tensor on every rank, under the names
// the one-device model gives them: what its state dict would hold.
Tensors merge_state_dicts(ParallelModule& module);
// Loads whole tensors (a one-device model's state dict, or what
// merge_state_dicts gave) into the parallel module's layouts, in place.
// Throws naming a missing, unknown or mis-shaped entry before loading any.
void load_merged_state_dict(ParallelModule& module, const Tensors& state);

}  // namespace tessel::parallel
