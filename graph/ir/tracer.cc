#include "graph/ir/tracer.h"

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/sbp_inference.h"
#include "sbp/global_tensor.h"

namespace tessel {

Tensor TracingInterpreter::Input(const std::string& name, const Tensor& example) {
  TESSEL_CHECK(example.defined()) << "graph '" << graph_.name() << "': input '" << name << "' is undefined";
  return LazyResult(graph_.AddInput(name, example));
}

namespace {
// What identifies a variable's tensor: its storage, or, for a metadata-only
// tensor (no storage), its lazy identity.
const void* VariableIdentity(const Tensor& t) {
  if (t.is_lazy() && t.lazy_value() != nullptr) return t.lazy_value().get();
  return t.impl_ptr()->storage().get();
}
}  // namespace

void TracingInterpreter::AddVariable(const std::string& name, const Tensor& tensor) {
  TESSEL_CHECK(tensor.defined()) << "graph '" << graph_.name() << "': variable '" << name << "' is undefined";
  const int id = graph_.AddVariable(name, tensor);
  variables_.emplace(VariableIdentity(tensor), id);
}

int TracingInterpreter::ValueOf(const Tensor& t, const std::string& what) {
  TESSEL_CHECK(t.defined()) << "graph '" << graph_.name() << "': " << what << " is undefined";
  if (t.is_lazy()) {
    const std::shared_ptr<const LazyValue> v = t.lazy_value();
    TESSEL_CHECK(v != nullptr && (v->graph == &graph_ || v->graph == nullptr))
        << "graph '" << graph_.name() << "': " << what << " is a lazy tensor " << t.ToString()
        << (v == nullptr ? " that belongs to no graph (metadata only)" : " of another graph");
    if (v->graph == &graph_) return v->id;
  }
  const void* identity = VariableIdentity(t);
  const ir::Value spec = ir::Value::SpecOf(t);
  auto [begin, end] = variables_.equal_range(identity);
  for (auto it = begin; it != end; ++it) {
    const ir::Value& v = graph_.value(it->second);
    if (v.SameSpec(spec)) return it->second;
  }
  const int id = graph_.AddVariable("captured_" + std::to_string(captured_++), t);
  variables_.emplace(identity, id);
  return id;
}

std::vector<int> TracingInterpreter::Record(const OpDef& op, const Attrs& attrs, std::vector<int> inputs,
                                            const std::vector<ir::Value>& outputs,
                                            std::vector<NdSbp> input_sbp, std::vector<NdSbp> output_sbp) {
  std::vector<int> ids =
      graph_.AddOp(op.name, attrs, std::move(inputs), outputs, std::move(input_sbp), std::move(output_sbp));
  ir::Op& recorded = graph_.mutable_op(static_cast<int>(graph_.ops().size()) - 1);
  recorded.backward = InBackward();
  if (op.run && !recorded.inputs.empty()) {
    // A layout change of what backward produced (an optimizer reducing a
    // gradient) is part of backward, as boxing insertion counts its own.
    const int producer = graph_.value(recorded.inputs[0]).producer;
    recorded.backward |= producer >= 0 && graph_.ops()[static_cast<size_t>(producer)].backward;
  }
  recorded.recompute_region = recorded.backward ? -1 : CurrentRecomputeRegion();  // regions are forward
  recorded.layer = CurrentLayer();
  return ids;
}

Tensor TracingInterpreter::LazyResult(int id) {
  const ir::Value& v = graph_.value(id);
  auto link = std::make_shared<const LazyValue>(&graph_, id);
  if (v.is_global()) return MakeLazyGlobal(v.shape, v.dtype, v.placement, v.nd_sbp, std::move(link));
  return Tensor::Lazy(v.shape, v.dtype, Device::CPU(), std::move(link));
}

namespace {

ir::Value LayoutChangeResult(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                             const std::string& graph) {
  ir::Value out;
  out.dtype = inputs[0].dtype();
  out.placement = Placement::Parse(attrs.Get<std::string>("placement"));
  out.nd_sbp = NdSbp::Parse(attrs.Get<std::string>("nd_sbp"));
  if (ir::KindOf(op.name) == ir::OpKind::kToGlobal) {
    TESSEL_CHECK(inputs[0].is_global()) << "graph '" << graph << "': to_global of a local tensor";
    out.shape = inputs[0].shape();
  } else {
    TESSEL_CHECK(ir::KindOf(op.name) == ir::OpKind::kFromLocal)
        << "graph '" << graph << "': op '" << op.name
        << "' runs as a whole (OpDef::run) and the tracer does not know its result; it cannot run lazily";
    bool splits = false;
    for (const Sbp& s : out.nd_sbp.sbps()) splits |= s.is_split();
    // Without a split every shard is the whole tensor (eager exchanges
    // nothing either); with one, the shape must be given.
    TESSEL_CHECK(attrs.Has("shape") || !splits)
        << "graph '" << graph << "': from_local of a " << inputs[0].ToString() << " as " << out.nd_sbp
        << " without its logical shape; in a graph the shape must be given (FromLocal(..., shape)), "
           "since finding it needs the ranks to exchange their shard shapes";
    out.shape = attrs.Has("shape") ? Shape(attrs.Get<std::vector<int64_t>>("shape")) : inputs[0].shape();
  }
  CheckGlobalLayout(out.shape, out.placement, out.nd_sbp);
  return out;
}

}  // namespace

OpResults InferOpResults(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                         const std::string& graph) {
  OpResults r;
  if (op.run) {
    r.outputs.push_back(LayoutChangeResult(op, inputs, attrs, graph));
    return r;
  }
  std::vector<TensorSpec> specs;
  int globals = 0;
  for (const Tensor& t : inputs) {
    specs.push_back({t.shape(), t.dtype()});
    globals += t.is_global();
  }
  TESSEL_CHECK(globals == 0 || globals == static_cast<int>(inputs.size()))
      << "graph '" << graph << "': op '" << op.name
      << "' mixes local and global inputs; make the local ones global with to_global";
  std::vector<TensorSpec> out_specs;
  try {
    out_specs = op.infer(specs, attrs);
  } catch (const Error& e) {
    TESSEL_THROW(e.code()) << "graph '" << graph << "': op '" << op.name << "': " << e.what();
  }
  r.outputs.resize(out_specs.size());
  for (size_t o = 0; o < r.outputs.size(); ++o) {
    r.outputs[o].shape = out_specs[o].shape;
    r.outputs[o].dtype = out_specs[o].dtype;
  }
  if (globals > 0) {
    const Placement& placement = inputs[0].placement();
    for (size_t i = 1; i < inputs.size(); ++i) {
      TESSEL_CHECK(inputs[i].placement() == placement)
          << "graph '" << graph << "': op '" << op.name << "': input " << op.input_name(i) << " is on "
          << inputs[i].placement() << ", input " << op.input_name(0) << " on " << placement
          << "; move them to one placement with to_global first";
    }
    const std::shared_ptr<const NdSignature> sig = InferNdSignature(op, attrs, inputs, placement);
    r.input_sbp = sig->inputs;
    r.output_sbp = sig->outputs;
    for (size_t o = 0; o < r.outputs.size(); ++o) {
      r.outputs[o].placement = placement;
      r.outputs[o].nd_sbp = sig->outputs[o];
    }
  }
  return r;
}

std::vector<Tensor> TracingInterpreter::Apply(const OpDef& op, const std::vector<Tensor>& inputs,
                                              const Attrs& attrs) {
  std::vector<int> ids;
  for (size_t i = 0; i < inputs.size(); ++i)
    ids.push_back(ValueOf(inputs[i], "op '" + op.name + "' input " + op.input_name(i)));
  for (int i : op.mutates) {
    TESSEL_CHECK(graph_.value(ids[i]).kind == ir::Value::Kind::kVariable)
        << "graph '" << graph_.name() << "': op '" << op.name << "' updates its input " << op.input_name(i)
        << " in place; in a graph only variables (eager tensors the graph holds: parameters, optimizer "
           "state) can be updated, and this one is a traced value";
  }
  OpResults r = InferOpResults(op, inputs, attrs, graph_.name());
  const std::vector<int> out_ids =
      Record(op, attrs, std::move(ids), r.outputs, std::move(r.input_sbp), std::move(r.output_sbp));
  std::vector<Tensor> results;
  if (!op.mutates.empty()) {
    for (int i : op.mutates) results.push_back(inputs[i]);  // the variables themselves, as eager returns them
    return results;
  }
  for (int id : out_ids) results.push_back(LazyResult(id));
  return results;
}

}  // namespace tessel
