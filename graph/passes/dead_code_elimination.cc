// Dead-code elimination: a backward pass traced whole computes gradients
// nobody asked for (an input's, a frozen parameter's); dropping them saves
// their kernels and the boxing they would need.
#include <vector>

#include "graph/global_tensor_ops.h"
#include "graph/passes/passes.h"

namespace tessel::passes {

void EliminateDeadCode(ir::Graph& graph) {
  EnsureLayoutOps();  // a graph may hold layout changes: look them up
  std::vector<bool> needed(graph.values().size(), false);
  for (const auto& [name, id] : graph.outputs()) needed[id] = true;
  const std::vector<ir::Op>& ops = graph.ops();
  std::vector<bool> keep(ops.size(), false);
  for (size_t n = ops.size(); n-- > 0;) {
    const ir::Op& op = ops[n];
    // In-place updates and sends (no result: their effect is elsewhere) stay.
    bool live = !GetOpDef(op.name).mutates.empty() || op.outputs.empty();
    for (int o : op.outputs) live |= needed[o];
    if (!live) continue;
    keep[n] = true;
    for (int i : op.inputs) needed[i] = true;
  }
  std::vector<ir::Op> kept;
  for (size_t n = 0; n < ops.size(); ++n)
    if (keep[n]) kept.push_back(ops[n]);
  if (kept.size() != ops.size()) graph.SetOps(std::move(kept));
}

}  // namespace tessel::passes
