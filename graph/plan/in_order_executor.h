// Runs a traced (usually compiled) graph on this rank, op by op in program
// order: the instructions of its executable plan (graph/plan/exec_plan.h),
// on the caller's thread. The reference executor: the actor runtime
// (runtime/actor_runtime.h) runs the same instructions on actors. Variables
// are the graph's own tensors, so in-place updates persist across calls.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "graph/ir/graph_ir.h"
#include "graph/plan/exec_plan.h"

namespace tessel {

struct RunStats {
  // The most CPU memory the run held at once beyond what was held when it
  // started: op results alive together (graph/passes/memory_planning.h
  // predicts these) plus whatever kernels and communication allocate for
  // themselves. Measured by the allocator, so other threads' CPU
  // allocations during the run count too.
  int64_t peak_bytes = 0;
};

// What both executors (this one and the actor runtime) share: the graph's
// values as a table by value id, with every variable and input bound
// (checked as RunInOrder says); op results are filled in as ops run.
std::vector<Tensor> BindGraphValues(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs);

// Binds every graph input by name (each must be given, with the shape,
// dtype and layout it was traced with; errors name the input and both
// specs), runs every instruction of `plan` (lowered for this rank with
// every op) in program order — a graph's micro-batch units once per
// micro-batch (graph/passes/step_runs.h) — and returns the named outputs.
// Each op result is freed after its last reader. With `stats`, measures the run's peak
// memory.
std::map<std::string, Tensor> RunInOrder(const plan::ExecPlan& plan,
                                         const std::map<std::string, Tensor>& inputs,
                                         RunStats* stats = nullptr);
// The same for one run: lowers `graph` for this rank first (a Graph keeps
// its plans; this is for a graph run once).
std::map<std::string, Tensor> RunInOrder(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs,
                                         RunStats* stats = nullptr);

}  // namespace tessel
