// Small graphs written by hand for the compiler passes' tests: values and
// ops with the layouts a signature would choose, on any mesh (nothing runs,
// so the placement need not fit this process's world).
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "graph/global_tensor_ops.h"
#include "graph/ir/graph_ir.h"

namespace tessel::testing {

class SmallGraph {
 public:
  SmallGraph(const std::string& name, Placement placement) : graph(name), placement_(std::move(placement)) {}

  // An input on the graph's placement (or `placement`).
  int Input(const std::string& name, const Shape& shape, const NdSbp& nd_sbp, DType dtype = DType::kFloat32,
            const Placement* placement = nullptr) {
    return graph.AddInput(name, Spec(shape, nd_sbp, dtype, placement));
  }
  // An op reading `inputs` as `in_sbp` and writing one value of `shape`
  // laid out as `out_sbp`, on its first input's placement.
  int Op(const std::string& op, std::vector<int> inputs, std::vector<NdSbp> in_sbp, const Shape& shape,
         const NdSbp& out_sbp, const Attrs& attrs = {}) {
    const ir::Value& first = graph.value(inputs.at(0));
    const ir::Value out = Spec(shape, out_sbp, first.dtype, &first.placement);
    return graph.AddOp(op, attrs, std::move(inputs), {out}, std::move(in_sbp), {out_sbp}).at(0);
  }
  // A to_global op of `value` to `nd_sbp` on the value's placement (or on
  // `placement`).
  int ToGlobal(int value, const NdSbp& nd_sbp, const Placement* placement = nullptr) {
    const ir::Value& v = graph.value(value);
    const Placement to = placement != nullptr ? *placement : v.placement;
    const ir::Value out = Spec(v.shape, nd_sbp, v.dtype, &to);
    return graph.AddOp("to_global", LayoutAttrs(to, nd_sbp), {value}, {out}).at(0);
  }
  ir::Value Spec(const Shape& shape, const NdSbp& nd_sbp, DType dtype = DType::kFloat32,
                 const Placement* placement = nullptr) const {
    ir::Value v;
    v.shape = shape;
    v.dtype = dtype;
    v.placement = placement != nullptr ? *placement : placement_;
    v.nd_sbp = nd_sbp;
    return v;
  }
  int Count(const std::string& op) const {
    int n = 0;
    for (const ir::Op& o : graph.ops()) n += o.name == op;
    return n;
  }

  ir::Graph graph;

 private:
  Placement placement_;
};

// "[S(0), B] on cpu:[0, 1]"
inline std::string Layout(const NdSbp& nd_sbp, const Placement& placement) {
  return nd_sbp.ToString() + " on " + placement.ToString();
}

// The (value, layout) pairs global ops read with a layout other than the
// value's own: the conversions boxing insertion must make explicit.
inline std::set<std::pair<int, std::string>> ImplicitBoxings(const ir::Graph& g) {
  std::set<std::pair<int, std::string>> edges;
  for (const ir::Op& op : g.ops()) {
    for (size_t i = 0; i < op.input_sbp.size(); ++i) {
      const ir::Value& v = g.value(op.inputs[i]);
      if (v.nd_sbp != op.input_sbp[i]) edges.insert({v.id, Layout(op.input_sbp[i], v.placement)});
    }
  }
  return edges;
}

// The layout changes of a graph: (input value, resulting layout) of each
// to_global op, and whether it changes anything.
struct LayoutChange {
  int value;
  std::string to;
  bool changes;
  auto operator<=>(const LayoutChange&) const = default;
};
inline std::vector<LayoutChange> LayoutChanges(const ir::Graph& g) {
  std::vector<LayoutChange> changes;
  for (const ir::Op& op : g.ops()) {
    if (op.name != "to_global") continue;
    const ir::Value& in = g.value(op.inputs[0]);
    const ir::Value& out = g.value(op.outputs[0]);
    changes.push_back({in.id, Layout(out.nd_sbp, out.placement), !in.SameSpec(out)});
  }
  return changes;
}

}  // namespace tessel::testing
