// SplitStages: the pipeline cut of the built-in policies (plan.h).
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "parallel/plan.h"

namespace tessel::parallel {

OpWork WorkOf(const ir::Graph& g, const ir::Op& op) {
  double out = 0;
  for (int v : op.outputs) out += static_cast<double>(g.value(v).shape.numel());
  if (op.name == "matmul" && op.inputs.size() == 2) {
    const ir::Value& a = g.value(op.inputs[0]);
    const bool ta = op.attrs.Has("transpose_a") && op.attrs.Get<bool>("transpose_a");
    return {out * static_cast<double>(a.shape.ndim() >= 2 ? a.shape[ta ? -2 : -1] : 1), 0};
  }
  if ((op.name == "linear" || op.name == "linear_gelu_tanh") && op.inputs.size() == 3) {
    // [..., k] x [k, n]: k multiply-adds per element of the product (the first output).
    const ir::Value& x = g.value(op.inputs[0]);
    return {static_cast<double>(g.value(op.outputs[0]).shape.numel()) * static_cast<double>(x.shape[-1]),
            out};
  }
  if (op.name == "linear_weight_grad" && op.inputs.size() == 2) {
    // dW [k, n] sums over every row of x [..., k].
    const Shape& x = g.value(op.inputs[0]).shape;
    const double rows = x[-1] == 0 ? 0 : static_cast<double>(x.numel() / x[-1]);
    return {static_cast<double>(g.value(op.outputs[0]).shape.numel()) * rows, 0};
  }
  return {0, out};
}

std::vector<int> SplitStages(const ir::Graph& g, const std::set<std::string>& parameters, int64_t stages,
                             std::vector<std::string>* reasons) {
  const int n = static_cast<int>(g.ops().size());
  TESSEL_CHECK(stages >= 1) << "SplitStages: " << stages << " stages; expected 1 or more";
  if (stages == 1) return std::vector<int>(static_cast<size_t>(n), 0);
  // Where a cut may go: before an op reading a parameter no op read before.
  std::vector<double> before(static_cast<size_t>(n) + 1, 0);  // cost of ops [0, i)
  std::vector<int> candidates;
  std::set<int> seen;
  for (int i = 0; i < n; ++i) {
    const ir::Op& op = g.ops()[static_cast<size_t>(i)];
    bool fresh = false;
    for (int v : op.inputs) {
      const ir::Value& value = g.value(v);
      if (value.kind == ir::Value::Kind::kVariable && parameters.count(value.name) && seen.insert(v).second)
        fresh = true;
    }
    if (fresh && i > 0) candidates.push_back(i);
    // Only the ratio between stages matters: multiply-adds and elements add.
    const OpWork work = WorkOf(g, op);
    before[static_cast<size_t>(i) + 1] = before[static_cast<size_t>(i)] + work.multiply_adds + work.elements;
  }
  TESSEL_CHECK(static_cast<int64_t>(candidates.size()) >= stages - 1)
      << "pipeline: the model has " << candidates.size()
      << " places to cut (ops reading a parameter no earlier op read, after the first op); " << stages
      << " stages need " << stages - 1;
  const double total = before.back();
  // Each cut nearest its share of the cost, leaving enough candidates for
  // the cuts after it.
  std::vector<int> cuts;
  size_t next = 0;
  for (int64_t k = 1; k < stages; ++k) {
    const double target = total * static_cast<double>(k) / static_cast<double>(stages);
    const size_t last = candidates.size() - static_cast<size_t>(stages - k);  // leave room for the rest
    size_t best = next;
    for (size_t c = next; c <= last; ++c)
      if (std::abs(before[static_cast<size_t>(candidates[c])] - target) <
          std::abs(before[static_cast<size_t>(candidates[best])] - target))
        best = c;
    cuts.push_back(candidates[best]);
    next = best + 1;
  }
  std::vector<int> op_stage(static_cast<size_t>(n), 0);
  int stage = 0;
  for (int i = 0; i < n; ++i) {
    while (stage < static_cast<int>(cuts.size()) && i >= cuts[static_cast<size_t>(stage)]) ++stage;
    op_stage[static_cast<size_t>(i)] = stage;
  }
  if (reasons) {
    std::ostringstream line;
    line << "pipeline: " << stages << " stages cut before ops";
    for (size_t k = 0; k < cuts.size(); ++k) {
      const ir::Op& op = g.ops()[static_cast<size_t>(cuts[k])];
      line << (k ? ", " : " ") << cuts[k] << " '" << op.name << "'";
    }
    line << " (each before a new parameter's first use) for shares of the forward's cost";
    for (int64_t s = 0; s < stages; ++s) {
      const double from = s == 0 ? 0 : before[static_cast<size_t>(cuts[static_cast<size_t>(s - 1)])];
      const double to = s + 1 == stages ? total : before[static_cast<size_t>(cuts[static_cast<size_t>(s)])];
      line << (s ? ", " : " ") << static_cast<int>(std::lround(100.0 * (to - from) / total)) << "%";
    }
    reasons->push_back(line.str());
  }
  return op_stage;
}

}  // namespace tessel::parallel
