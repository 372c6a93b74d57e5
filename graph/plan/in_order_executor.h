// Runs a traced (usually compiled) graph on this rank, op by op in program order, through the
// eager interpreter (without autograd): the reference executor graph mode
// trains with until the actor runtime replaces it. Variables are the
// graph's own tensors, so in-place updates persist across calls. Each op's
// results must have the layouts the graph records (an internal error
// otherwise).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "graph/ir/graph_ir.h"

namespace tessel {

struct RunStats {
  // The most CPU memory the run held at once beyond what was held when it
  // started: op results alive together (graph/passes/memory_planning.h
  // predicts these) plus whatever kernels and communication allocate for
  // themselves. Measured by the allocator, so other threads' CPU
  // allocations during the run count too.
  int64_t peak_bytes = 0;
};

// Binds every graph input by name (each must be given, with the shape,
// dtype and layout it was traced with; errors name the input and both
// specs) and returns the named outputs. Each op result is freed after its
// last reader. With `stats`, measures the run's peak memory.
// What both executors (this one and the actor runtime) share: the graph's
// values as a table by value id, with every variable and input bound
// (checked as RunInOrder says); op results are filled in as ops run.
std::vector<Tensor> BindGraphValues(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs);
// Runs one op of the graph through the eager interpreter on `args` and
// checks its results have the layouts the graph compiled; errors name the
// graph and the op.
std::vector<Tensor> ApplyGraphOp(const ir::Graph& graph, const ir::Op& op, const std::vector<Tensor>& args);

std::map<std::string, Tensor> RunInOrder(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs,
                                         RunStats* stats = nullptr);

}  // namespace tessel
