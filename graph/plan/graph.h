// A step captured once and run many times: the graph-mode counterpart of
// calling model code eagerly, in the manner of OneFlow's nn.Graph. The build
// function is ordinary model code — forward, loss.backward(), gradient
// clipping (optim::ClipGradNormTensor), an optimizer step — that receives
// its inputs as lazy tensors and returns named results. It runs under the
// tracing interpreter with autograd layered over it, so forward, backward
// and update become one graph. The eager tensors it reads (parameters,
// optimizer state, the learning rate) become variables the graph holds:
// updates are in place, seen by eager code and by the next call alike.
//
// The first call with a set of input specs (shape, dtype, layout) traces a
// graph, compiles it (graph/passes/pass_manager.h: dead code removed, every
// layout change an explicit op, data-parallel gradient reductions bucketed)
// and caches it (with GraphOptions::micro_batches, forward and backward
// run once per micro-batch); later calls with the same specs run the cached graph;
// inputs of another shape trace and compile another one, and the log says
// so; an input whose dtype changes is an error. The graph runs on the
// in-order executor unless GraphOptions::executor names another (the actor
// runtime's).
//
//   Graph step("train_step", [&](const Graph::Tensors& in) -> Graph::Tensors {
//     Tensor loss = model.Loss(in.at("ids"), in.at("labels"));
//     loss.backward();
//     Tensor norm = optim::ClipGradNormTensor(params, 1.0);
//     adamw.Step();
//     return {{"loss", loss}, {"grad_norm", norm}};
//   });
//   for (...) { adamw.set_lr(schedule(i)); auto out = step({{"ids", x}, {"labels", y}}); }
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "graph/ir/graph_ir.h"
#include "graph/plan/exec_plan.h"

namespace tessel {

struct GraphOptions {
  // Gradient accumulation (OneFlow's set_gradient_accumulation_steps, LiBai's
  // num_accumulation_steps): each call cuts every input along dimension 0
  // into this many micro-batches, runs forward and backward once per
  // micro-batch and the rest of the step (clipping, the optimizer) once, on
  // the gradients averaged over the micro-batches. With a mean loss that is
  // the step the whole batch would take at once, in a micro-batch's
  // activation memory. Results computed from the batch must be scalars and
  // come back averaged (the loss). 1: off.
  int micro_batches = 1;
  // Pipeline stages: the world ranks of each stage and the stage of each
  // model layer (LayerScope's layer_idx), from the model's dist config
  // (layers/dist.h: StageRanks, LayerStages). Compiling gives every op its
  // stage, turns values crossing stages into send / recv pairs and refuses
  // an op of a layer computed on another stage's ranks. Empty: no check.
  std::vector<std::vector<int>> stage_ranks = {};
  std::vector<int64_t> layer_stages = {};
  // What runs the compiled graph at each call, given the inputs: unset, the
  // in-order executor (graph/plan/in_order_executor.h); the actor runtime
  // (runtime/actor_runtime.h: ActorRuntime::Executor) runs pipeline
  // schedules with communication on its own thread.
  std::function<std::map<std::string, Tensor>(const ir::Graph&, const std::map<std::string, Tensor>&)>
      executor = {};
};

class Graph {
 public:
  using Tensors = std::map<std::string, Tensor>;
  using BuildFn = std::function<Tensors(const Tensors& inputs)>;

  Graph(std::string name, BuildFn build, GraphOptions options = {});

  // Runs the graph traced for these inputs' specs (tracing it first if
  // new) and returns its named results.
  Tensors operator()(const Tensors& inputs);
  // The compiled graph for these inputs' specs, traced and compiled now if
  // new; nothing runs.
  const ir::Graph& Trace(const Tensors& inputs);
  size_t traced_graphs() const { return cache_.size(); }

 private:
  // The lazy input the build function sees: with micro-batches, the first
  // micro-batch of `input` (a micro_batch op; the compiler's gradient
  // accumulation copies the step for the others).
  Tensor MicroBatchOf(const std::string& name, const Tensor& input) const;

  std::string name_;
  BuildFn build_;
  GraphOptions options_;
  std::map<std::string, std::unique_ptr<ir::Graph>> cache_;  // by the inputs' specs
  // Each cached graph's plan for this rank, lowered at its first in-order
  // run (with GraphOptions::executor unset).
  std::map<const ir::Graph*, plan::ExecPlan> plans_;
  std::map<std::string, DType> input_dtypes_;  // by input name, from the first call
};

}  // namespace tessel
