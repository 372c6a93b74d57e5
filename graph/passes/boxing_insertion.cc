// Boxing insertion: the trace records, for each global op, the layouts its
// signature chose; eager dispatch converts mismatched inputs on the fly.
// Here each such conversion becomes a to_global op of its own, so a rank's
// plan can list its collectives, later passes can fuse and schedule them,
// and the executor runs every op on inputs already laid out as it needs.
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "graph/global_tensor_ops.h"
#include "graph/passes/passes.h"

namespace tessel::passes {

void InsertBoxing(ir::Graph& graph) {
  EnsureLayoutOps();
  std::vector<ir::Op> out;
  out.reserve(graph.ops().size());
  // Identity layout changes removed: their output reads as their input.
  std::map<int, int> alias;
  auto resolve = [&](int id) {
    auto it = alias.find(id);
    return it == alias.end() ? id : it->second;
  };
  // One conversion per (value, layout), made before its first reader.
  std::map<std::pair<int, std::string>, int> converted;
  bool changed = false;
  for (ir::Op op : graph.ops()) {
    for (int& i : op.inputs) i = resolve(i);
    if (op.kind == ir::OpKind::kToGlobal) {
      const ir::Value& in = graph.value(op.inputs.at(0));
      const ir::Value& result = graph.value(op.outputs.at(0));
      if (in.placement == result.placement && in.nd_sbp == result.nd_sbp) {
        alias[result.id] = in.id;
        changed = true;
        continue;
      }
    }
    const OpDef& def = GetOpDef(op.name);
    for (size_t i = 0; i < op.input_sbp.size(); ++i) {
      const ir::Value& v = graph.value(op.inputs[i]);
      const NdSbp& want = op.input_sbp[i];
      if (v.nd_sbp == want) continue;
      for (int m : def.mutates) {
        TESSEL_CHECK_CODE(m != static_cast<int>(i), StatusCode::kInternal)
            << "op " << op.id << " '" << op.name << "' updates its input " << def.input_name(i) << " (%"
            << v.id << ", " << v.SpecString() << ") in place but its signature reads it as " << want
            << "; an updated input is never converted";
      }
      auto [it, is_new] = converted.try_emplace({v.id, want.ToString()}, -1);
      if (is_new) {
        ir::Value spec = v;
        spec.nd_sbp = want;
        ir::Op box;
        box.name = "to_global";
        box.attrs = LayoutAttrs(v.placement, want);
        box.inputs = {v.id};
        // It belongs to its first reader's layer, and to backward when that
        // reader or the value's producer is a gradient op (a gradient's
        // reduction for the optimizer is part of backward).
        box.layer = op.layer;
        box.backward = op.backward;
        if (v.producer >= 0) {
          const ir::Op& producer = graph.ops()[static_cast<size_t>(v.producer)];
          // Converting one micro-batch's value is part of it (a sum over the
          // micro-batches is the step's).
          if (producer.kind != ir::OpKind::kMicroBatchSum) box.micro_batch = producer.micro_batch;
          box.backward |= producer.backward;
        }
        box.outputs = {graph.NewValue(spec)};  // `v` dangles from here: values may move
        it->second = box.outputs[0];
        out.push_back(std::move(box));
      }
      op.inputs[i] = it->second;
      changed = true;
    }
    out.push_back(std::move(op));
  }
  if (!changed) return;
  for (const auto& [name, id] : graph.outputs())
    if (alias.count(id)) graph.RedirectOutput(name, resolve(id));
  graph.SetOps(std::move(out));
}

}  // namespace tessel::passes
