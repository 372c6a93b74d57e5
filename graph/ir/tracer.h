// The tracing interpreter: while a graph is built, functional ops are
// recorded into an ir::Graph instead of running. Its results are lazy
// tensors (shape, dtype, layout; no data) linked to their graph values, so
// the same model code runs unchanged: layouts come from the same signature
// inference eager dispatch uses, and autograd layered over this interpreter
// records the backward ops from the same OpDef gradients.
//
// Eager tensors an op reads while tracing (parameters, optimizer state,
// constants a model builds) become graph variables: the graph keeps a
// handle on their storage, so in-place updates persist across calls.
// Metadata-only tensors with an identity (a model built for planning,
// graph/ir/meta.h) become variables too; such a graph compiles but cannot run.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "ops/interpreter.h"

namespace tessel {

// What an op applied to `inputs` (lazy or eager tensors) gives, without
// running it: each result's spec (OpDef::infer's shape and dtype; for
// global ops, the placement and the layouts eager's signature inference
// picks, which are also the layouts the op reads its inputs in), and, for
// layout changes (to_global, from_local), the spec their attributes ask
// for. Errors name `graph` and the op.
struct OpResults {
  std::vector<ir::Value> outputs;
  std::vector<NdSbp> input_sbp, output_sbp;  // empty for local ops and layout changes
};
OpResults InferOpResults(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                         const std::string& graph);

class TracingInterpreter final : public Interpreter {
 public:
  explicit TracingInterpreter(ir::Graph& graph) : graph_(graph) {}

  // A lazy tensor for graph input `name`, with the spec (shape, dtype,
  // layout) of `example`.
  Tensor Input(const std::string& name, const Tensor& example);
  // Registers `tensor` as a variable under `name` before it is first read
  // (otherwise captured tensors are named "captured_<n>").
  void AddVariable(const std::string& name, const Tensor& tensor);
  // The graph value `t` stands for: its lazy link, or the variable of an
  // eager tensor (added if new). `what` names it in errors.
  int ValueOf(const Tensor& t, const std::string& what);

  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override;
  bool records() const override { return true; }

 private:
  Tensor LazyResult(int id);
  // Appends an op tagged as backward (autograd is running backward(), or a
  // layout change of a gradient), with its activation-checkpoint region and
  // its layer (graph/autograd.h).
  std::vector<int> Record(const OpDef& op, const Attrs& attrs, std::vector<int> inputs,
                          const std::vector<ir::Value>& outputs, std::vector<NdSbp> input_sbp,
                          std::vector<NdSbp> output_sbp);

  ir::Graph& graph_;
  // Variables by storage, or by identity for metadata-only tensors (a model
  // built in a MetaWorldScope); an entry per (storage, spec): a global
  // tensor and its local shard share storage but are different values.
  std::multimap<const void*, int> variables_;
  int captured_ = 0;
};

}  // namespace tessel
