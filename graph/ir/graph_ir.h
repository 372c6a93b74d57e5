// The traced graph: what a graph build records when model code runs under
// the tracing interpreter (graph/ir/tracer.h). Values are in SSA form with
// their logical shape, dtype and — for global values — placement and NdSbp;
// ops are in program order with their attributes and, for global ops, the
// signature inference chose. Graph inputs are bound by name at each call;
// variables are tensors the graph holds across calls (parameters, optimizer
// state), updated in place by ops that declare OpDef::mutates.
//
// Text dump, Graphviz dot and protobuf forms are for people and tools; the
// compiler passes and the executors read the structures directly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ops/op_def.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

namespace tessel {
namespace proto {
class GraphProto;
}

namespace ir {

struct Value {
  enum class Kind { kOpOutput, kInput, kVariable };
  int id = 0;
  Kind kind = Kind::kOpOutput;
  std::string name;  // inputs and variables
  Shape shape;       // logical
  DType dtype = DType::kFloat32;
  Placement placement;  // default (empty): a local value
  NdSbp nd_sbp;
  int producer = -1;  // the op's id; -1 for inputs and variables
  int output_index = 0;
  bool is_global() const { return placement.size() > 0; }
  // The spec (shape, dtype, layout) of a tensor, eager or lazy.
  static Value SpecOf(const Tensor& t);
  // Same shape, dtype, placement and NdSbp.
  bool SameSpec(const Value& o) const {
    return shape == o.shape && dtype == o.dtype && placement == o.placement && nd_sbp == o.nd_sbp;
  }
  // "f32 [8, 4] [S(0)] on cpu:[0, 1]"
  std::string SpecString() const;
};

// An attribute's value as the text dump writes it ("[2, 3]", "true", "0.5").
std::string AttrString(const AttrValue& v);

// The ops the compiler passes and executors treat specially, typed so that
// they test a field and not an op's name. Every other op is a kernel.
enum class OpKind : uint8_t {
  kKernel,
  kToGlobal,        // to_global: a global tensor to another layout (boxing)
  kFromLocal,       // from_local: a local shard to a global tensor
  kSend,            // send: a pipeline stage transfer's sending side
  kRecv,            // recv: and its receiving side
  kGradientBucket,  // all_reduce_bucket: data-parallel gradients reduced together
  kMicroBatch,      // micro_batch: the cut of a step's batch into one micro-batch
  kMicroBatchSum,   // micro_batch_sum: the running sum of a value over the micro-batches
};
// The kind of the op named `op_name`.
OpKind KindOf(std::string_view op_name);

struct Op {
  int id = 0;
  std::string name;  // the OpDef's
  // KindOf(name), set by Graph::AddOp and Graph::SetOps (a pass building
  // an op names it; the graph it is installed in types it).
  OpKind kind = OpKind::kKernel;
  Attrs attrs;
  std::vector<int> inputs;
  std::vector<int> outputs;
  // The chosen layouts of a global op's inputs and outputs (empty if local).
  std::vector<NdSbp> input_sbp;
  std::vector<NdSbp> output_sbp;
  // Which micro-batch the op works on (graph/passes: gradient_accumulation);
  // -1: the op runs once per step. In a graph of micro-batch units
  // (Graph::micro_batch_units() > 1) every op of the units says 0: it runs
  // once per micro-batch (graph/passes/step_runs.h).
  int micro_batch = -1;
  // A gradient op: recorded while autograd ran backward().
  bool backward = false;
  // The activation-checkpoint region (RecomputeScope) a forward op belongs
  // to, or, on a backward op, the region it recomputes (graph/passes:
  // activation_checkpointing); -1: none.
  int recompute_region = -1;
  // The model layer (layer_idx) whose code recorded the op, or whose op
  // this is the gradient of (graph/autograd.h: LayerScope); a layout change
  // takes its reader's. -1: outside every layer (embeddings, loss, optimizer).
  int64_t layer = -1;
  // The pipeline stage whose ranks run the op (graph/passes:
  // stage_assignment); -1: every rank (local ops) or stages not assigned.
  int stage = -1;
};

class Graph {
 public:
  explicit Graph(std::string name = "graph") : name_(std::move(name)), serial_(NextSerial()) {}
  // Copies are other graphs (a serial of their own); a move keeps it.
  Graph(const Graph& other);
  Graph& operator=(const Graph& other);
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  const std::string& name() const { return name_; }
  // A number no other graph of this process has had: what an executor
  // keys its per-graph state by (an address may be reused by a later graph).
  uint64_t serial() const { return serial_; }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Op>& ops() const { return ops_; }
  const Value& value(int id) const { return values_.at(static_cast<size_t>(id)); }
  // Named results, in name order.
  const std::map<std::string, int>& outputs() const { return outputs_; }
  // The tensor a variable value stands for (shares its storage).
  const Tensor& variable(int id) const { return variables_.at(id); }

  // A value described by `spec_of` (shape, dtype, layout; data unused).
  int AddInput(const std::string& name, const Tensor& spec_of);
  // The same from a spec (shape, dtype, layout); its placement need not lie
  // in this process's world (a plan compiled for another world size).
  int AddInput(const std::string& name, const Value& spec);
  // An eager tensor, or a metadata-only one built for planning
  // (graph/ir/meta.h; the graph then compiles but cannot run).
  int AddVariable(const std::string& name, const Tensor& tensor);
  // Appends an op; returns its output value ids, whose specs are given.
  std::vector<int> AddOp(const std::string& op, const Attrs& attrs, std::vector<int> inputs,
                         const std::vector<Value>& output_specs, std::vector<NdSbp> input_sbp = {},
                         std::vector<NdSbp> output_sbp = {});
  // The op with this id, for the tracer to tag the op it just appended.
  Op& mutable_op(int id) { return ops_.at(static_cast<size_t>(id)); }
  // Names a value as a result; throws if the name is taken.
  void MarkOutput(const std::string& name, int value);
  // Marks a value as a variable's gradient as backward left it (the trace
  // learns them from autograd); gradient accumulation sums these over the
  // micro-batches.
  void MarkGradient(int value);
  const std::set<int>& gradients() const { return gradients_; }
  // How many micro-batches the units of this graph stand for: gradient
  // accumulation leaves forward and backward once (ops of micro_batch 0,
  // their gradients summed by micro_batch_sum ops) and the passes after it
  // work on that; executors run the units once per micro-batch
  // (graph/passes/step_runs.h). 0: no units.
  int micro_batch_units() const { return micro_batch_units_; }
  void set_micro_batch_units(int micro_batches) { micro_batch_units_ = micro_batches; }
  int InputId(const std::string& name) const;  // throws naming the inputs if unknown

  // For compiler passes (graph/passes), which rewrite the op list:
  // A new op-output value with `spec`'s shape, dtype and layout; it gets
  // its producer when SetOps installs the op that lists it as an output.
  int NewValue(const Value& spec);
  // Replaces the ops. They are renumbered in order and each output value's
  // producer and output index are updated; values no op produces any more
  // (nor inputs, variables) are left out of the text, dot and protobuf.
  void SetOps(std::vector<Op> ops);
  // Points the named result `name` at `value` instead.
  void RedirectOutput(const std::string& name, int value);
  // Whether the value is an input, a variable or an op's output now.
  bool IsLive(int id) const;

  // One line per value and op, in program order.
  std::string ToText() const;
  // Graphviz: ops as boxes, inputs and variables as ellipses, edges
  // labelled with the value's spec.
  std::string ToDot() const;
  void ToProto(proto::GraphProto* out) const;

 private:
  int AddValue(Value v);
  static uint64_t NextSerial();

  std::string name_;
  uint64_t serial_ = 0;
  std::vector<Value> values_;
  std::vector<Op> ops_;
  std::map<std::string, int> outputs_;
  std::set<int> gradients_;
  std::map<std::string, int> inputs_by_name_;
  std::map<int, Tensor> variables_;
  int micro_batch_units_ = 0;
};

// What must run before each op (by op id): the producers of its inputs and,
// around an in-place update (OpDef::mutates), the ops that read the updated
// value before it (they must see the old data) and those that read it after
// (the new data). Every op's definition must be registered.
std::vector<std::vector<int>> Predecessors(const Graph& graph);

// An order of nodes 0..n-1 that runs each after its `preds`, taking among
// the ready nodes the one of least `priority` (ties: the lower index) —
// Kahn's algorithm. Shorter than n when the edges make a cycle.
std::vector<int> PriorityTopologicalOrder(const std::vector<std::vector<int>>& preds,
                                          const std::vector<int64_t>& priority);
// The same with node i's predecessors preds[pred_begin[i] .. pred_begin[i + 1])
// (one array for every node: what a schedule of many runs uses).
std::vector<int> PriorityTopologicalOrder(const std::vector<int>& pred_begin, const std::vector<int>& preds,
                                          const std::vector<int64_t>& priority);

// Checks the graph is well formed, as each pass must leave it: every op
// reads only values defined before it (inputs, variables, outputs of earlier
// ops), each value has one producer, results exist, a global op's inputs
// share one placement and it records a layout per input and output. With
// `explicit_boxing`, also that every global op's inputs already have the
// layouts it runs with (no boxing left implicit). Throws kInternal naming
// the op and what is wrong.
void Verify(const Graph& graph, bool explicit_boxing = false);

}  // namespace ir

}  // namespace tessel
