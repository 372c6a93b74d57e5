// Runs a traced (usually compiled) graph on this rank, op by op in program order, through the
// eager interpreter (without autograd): the reference executor graph mode
// trains with until the actor runtime replaces it. Variables are the
// graph's own tensors, so in-place updates persist across calls. Each op's
// results must have the layouts the graph records (an internal error
// otherwise).
#pragma once

#include <map>
#include <string>

#include "graph/ir/graph_ir.h"

namespace tessel {

// Binds every graph input by name (each must be given, with the shape,
// dtype and layout it was traced with; errors name the input and both
// specs) and returns the named outputs.
std::map<std::string, Tensor> RunInOrder(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs);

}  // namespace tessel
