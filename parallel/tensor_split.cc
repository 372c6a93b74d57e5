// ChooseTensorSplits: the tensor-parallel weight splits of the built-in
// policies (plan.h), found with signature inference on traces.
#include <sstream>

#include "core/error.h"
#include "parallel/plan.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::parallel {

namespace {

// The parameter a value is (through layout changes: a parameter moved to
// another stage), or "".
std::string ParameterOf(const ir::Graph& g, int value, const std::set<std::string>& parameters) {
  for (;;) {
    const ir::Value& v = g.value(value);
    if (v.kind == ir::Value::Kind::kVariable) return parameters.count(v.name) ? v.name : "";
    if (v.producer < 0) return "";
    const ir::Op& op = g.ops()[static_cast<size_t>(v.producer)];
    if ((op.name != "to_global" && op.name != "from_local") || op.inputs.size() != 1) return "";
    value = op.inputs[0];
  }
}

// A global value's entry on the tensor-parallel axis of a stage grid
// [dp, tp] (axes of size 1 dropped).
Sbp TensorAxisEntry(const NdSbp& nd_sbp, const ParallelPlan& plan) {
  const int axis = plan.data_parallel > 1 ? 1 : 0;
  return axis < nd_sbp.size() ? nd_sbp[axis] : B();
}

bool Flag(const ir::Op& op, const std::string& name) {
  return op.attrs.Has(name) && op.attrs.Get<bool>(name);
}

// A weight read by a matmul y = x W (or x W^T): the parameter and which of
// its dimensions are the input and the output features.
struct WeightUse {
  std::string name;
  int in_dim = 0, out_dim = 1;
};
WeightUse WeightOfMatmul(const ir::Graph& g, const ir::Op& op, const std::set<std::string>& parameters) {
  if (op.name != "matmul" || op.inputs.size() != 2 || Flag(op, "transpose_a")) return {};
  const std::string name = ParameterOf(g, op.inputs[1], parameters);
  if (name.empty() || g.value(op.inputs[1]).shape.ndim() != 2) return {};
  const bool tb = Flag(op, "transpose_b");
  return {name, tb ? 1 : 0, tb ? 0 : 1};
}

std::string SbpText(const Sbp& s) { return NdSbp({s}).ToString(); }

}  // namespace

std::map<std::string, Sbp> ChooseTensorSplits(const PolicyContext& context, ParallelPlan plan,
                                              std::vector<std::string>* reasons) {
  const int64_t tp = plan.tensor_parallel;
  std::map<std::string, Sbp> splits;  // decided (S(d) or B)
  if (tp <= 1) return splits;
  TESSEL_CHECK(context.trace != nullptr) << "ChooseTensorSplits needs the context's trace function";
  const std::set<std::string>& parameters = context.parameters;
  std::set<std::string> replicated;                // column splits undone: gathered before a row layer
  std::map<std::string, std::string> why;          // per decided weight
  std::map<std::string, std::string> weight_kind;  // "column" / "row"
  const size_t max_rounds = 4 * parameters.size() + 8;
  for (size_t round = 0;; ++round) {
    TESSEL_CHECK(round < max_rounds) << "tensor split: no fixed point after " << max_rounds << " traces";
    // 1. Weights in program order. A weight whose input depends on a weight
    //    decided in this trace waits for the next one (its input's layout
    //    changes with that decision).
    bool decided = false;
    plan.parameter_split = splits;
    std::unique_ptr<ir::Graph> g = context.trace(plan);
    std::set<int> tainted;  // values downstream of a weight decided in this trace
    for (const ir::Op& op : g->ops()) {
      bool taint = false;
      for (int v : op.inputs) taint = taint || tainted.count(v);
      const WeightUse w = WeightOfMatmul(*g, op, parameters);
      if (!w.name.empty() && !splits.count(w.name) && !tainted.count(op.inputs[0])) {
        const ir::Value& x = g->value(op.inputs[0]);
        const Shape& shape = g->value(op.inputs[1]).shape;
        const bool x_split_last =
            x.is_global() && TensorAxisEntry(x.nd_sbp, plan).is_split(static_cast<int>(x.shape.ndim()) - 1);
        const int dim = x_split_last ? w.in_dim : w.out_dim;
        const char* kind = x_split_last ? "row" : "column";
        if (replicated.count(w.name)) {
          splits[w.name] = B();
          why[w.name] = "replicated: its column split was gathered before a row layer read it";
        } else if (shape[dim] % tp != 0) {
          splits[w.name] = B();
          why[w.name] = std::string("replicated: as a ") + kind + " layer it splits dimension " +
                        std::to_string(dim) + " of " + shape.ToString() + ", which tp=" + std::to_string(tp) +
                        " does not divide";
        } else {
          splits[w.name] = S(dim);
          weight_kind[w.name] = kind;
          why[w.name] = std::string(kind) + " (" + SbpText(S(dim)) + "): its input arrives " +
                        (x_split_last ? "split on its last dimension" : "whole") + " over tp";
        }
        decided = true;
        taint = true;
      }
      if (taint)
        for (int v : op.outputs) tainted.insert(v);
    }
    if (decided) continue;

    // 2. Biases added to a column layer's output split with it.
    plan.parameter_split = splits;
    g = context.trace(plan);
    bool biases = false;
    for (const ir::Op& op : g->ops()) {
      if (op.name != "add" || op.inputs.size() != 2) continue;
      const ir::Value& y = g->value(op.inputs[0]);
      if (y.producer < 0) continue;
      const WeightUse w = WeightOfMatmul(*g, g->ops()[static_cast<size_t>(y.producer)], parameters);
      const std::string bias = ParameterOf(*g, op.inputs[1], parameters);
      if (w.name.empty() || bias.empty() || splits.count(bias) || weight_kind[w.name] != "column") continue;
      if (g->value(op.inputs[1]).shape.ndim() != 1) continue;
      splits[bias] = S(0);
      why[bias] = "split with " + w.name + ", the column layer it is added to";
      biases = true;
    }
    if (biases) {
      plan.parameter_split = splits;
      g = context.trace(plan);
    }

    // 3. A column split must reach a row layer (or the end) split: where
    //    inference first gathers a value carrying one, undo those.
    std::map<int, std::set<std::string>> carries;  // value -> column weights whose split it carries
    std::set<std::string> undo;
    for (const ir::Op& op : g->ops()) {
      // Only the first gather counts: what comes after it saw inputs laid
      // out by it, and may keep its splits once it is undone.
      if (!undo.empty()) break;
      std::set<std::string> carried;
      for (size_t i = 0; i < op.inputs.size(); ++i) {
        auto it = carries.find(op.inputs[i]);
        if (it == carries.end()) continue;
        const ir::Value& v = g->value(op.inputs[i]);
        const bool kept = i >= op.input_sbp.size() ||
                          TensorAxisEntry(op.input_sbp[i], plan) == TensorAxisEntry(v.nd_sbp, plan);
        if (kept)
          carried.insert(it->second.begin(), it->second.end());
        else
          undo.insert(it->second.begin(), it->second.end());
      }
      const WeightUse w = WeightOfMatmul(*g, op, parameters);
      if (!w.name.empty() && weight_kind[w.name] == "column") carried.insert(w.name);
      for (int v : op.outputs)
        if (!carried.empty() && g->value(v).is_global() &&
            TensorAxisEntry(g->value(v).nd_sbp, plan).is_split())
          carries[v] = carried;
    }
    if (undo.empty()) break;
    // Start over with those replicated: the weights after them see other
    // inputs now.
    replicated.insert(undo.begin(), undo.end());
    splits.clear();
    weight_kind.clear();
    why.clear();
  }
  if (reasons)
    for (const auto& [name, text] : why) reasons->push_back("tensor parallel: " + name + " " + text);
  return splits;
}

}  // namespace tessel::parallel
