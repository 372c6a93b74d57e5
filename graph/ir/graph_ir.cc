#include "graph/ir/graph_ir.h"

#include <atomic>
#include <queue>
#include <sstream>

#include "core/error.h"
#include "graph/ir/graph_ir.pb.h"

namespace tessel::ir {

OpKind KindOf(std::string_view op_name) {
  static const std::map<std::string_view, OpKind> kKinds = {{"to_global", OpKind::kToGlobal},
                                                            {"from_local", OpKind::kFromLocal},
                                                            {"send", OpKind::kSend},
                                                            {"recv", OpKind::kRecv},
                                                            {"all_reduce_bucket", OpKind::kGradientBucket},
                                                            {"micro_batch", OpKind::kMicroBatch},
                                                            {"micro_batch_sum", OpKind::kMicroBatchSum}};
  const auto it = kKinds.find(op_name);
  return it == kKinds.end() ? OpKind::kKernel : it->second;
}

uint64_t Graph::NextSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Graph::Graph(const Graph& other)
    : name_(other.name_),
      serial_(NextSerial()),
      values_(other.values_),
      ops_(other.ops_),
      outputs_(other.outputs_),
      gradients_(other.gradients_),
      inputs_by_name_(other.inputs_by_name_),
      variables_(other.variables_),
      micro_batch_units_(other.micro_batch_units_) {}

Graph& Graph::operator=(const Graph& other) {
  if (this == &other) return *this;
  name_ = other.name_;
  serial_ = NextSerial();
  values_ = other.values_;
  ops_ = other.ops_;
  outputs_ = other.outputs_;
  gradients_ = other.gradients_;
  inputs_by_name_ = other.inputs_by_name_;
  variables_ = other.variables_;
  micro_batch_units_ = other.micro_batch_units_;
  return *this;
}

namespace {

const char* KindName(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kInput:
      return "input";
    case Value::Kind::kVariable:
      return "variable";
    case Value::Kind::kOpOutput:
      break;
  }
  return "value";
}

// Dot string literal: quotes and backslashes escaped.
std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string AttrString(const AttrValue& v) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          os << Shape(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (x ? "true" : "false");
        } else {
          os << x;
        }
      },
      v);
  return os.str();
}

Value Value::SpecOf(const Tensor& t) {
  Value v;
  v.shape = t.shape();
  v.dtype = t.dtype();
  if (t.is_global()) {
    v.placement = t.placement();
    v.nd_sbp = t.nd_sbp();
  }
  return v;
}

std::string Value::SpecString() const {
  std::ostringstream os;
  os << dtype << " " << shape;
  if (is_global()) os << " " << nd_sbp << " on " << placement;
  return os.str();
}

int Graph::AddValue(Value v) {
  v.id = static_cast<int>(values_.size());
  values_.push_back(std::move(v));
  return values_.back().id;
}

int Graph::AddInput(const std::string& name, const Tensor& spec_of) {
  return AddInput(name, Value::SpecOf(spec_of));
}

int Graph::AddInput(const std::string& name, const Value& spec) {
  TESSEL_CHECK(!name.empty()) << "graph '" << name_ << "': an input needs a name";
  TESSEL_CHECK(inputs_by_name_.count(name) == 0)
      << "graph '" << name_ << "': input '" << name << "' bound twice";
  Value v = spec;
  v.producer = -1;
  v.output_index = 0;
  v.kind = Value::Kind::kInput;
  v.name = name;
  const int id = AddValue(std::move(v));
  inputs_by_name_[name] = id;
  return id;
}

int Graph::AddVariable(const std::string& name, const Tensor& tensor) {
  const bool meta = tensor.defined() && tensor.is_lazy() && tensor.lazy_value() != nullptr &&
                    tensor.lazy_value()->graph == nullptr;
  TESSEL_CHECK(tensor.defined() && (!tensor.is_lazy() || meta))
      << "graph '" << name_ << "': variable '" << name
      << "' must be an eager tensor (or one built for planning, graph/ir/meta.h), got " << tensor.ToString();
  Value v = Value::SpecOf(tensor);
  v.kind = Value::Kind::kVariable;
  v.name = name;
  const int id = AddValue(std::move(v));
  variables_[id] = tensor.detach();
  return id;
}

std::vector<int> Graph::AddOp(const std::string& op, const Attrs& attrs, std::vector<int> inputs,
                              const std::vector<Value>& output_specs, std::vector<NdSbp> input_sbp,
                              std::vector<NdSbp> output_sbp) {
  for (int i : inputs) {
    TESSEL_CHECK_CODE(i >= 0 && i < static_cast<int>(values_.size()), StatusCode::kInternal)
        << "graph '" << name_ << "': op '" << op << "' reads value " << i << ", which does not exist";
  }
  Op node;
  node.id = static_cast<int>(ops_.size());
  node.name = op;
  node.kind = KindOf(op);
  node.attrs = attrs;
  node.inputs = std::move(inputs);
  node.input_sbp = std::move(input_sbp);
  node.output_sbp = std::move(output_sbp);
  for (size_t o = 0; o < output_specs.size(); ++o) {
    Value v = output_specs[o];
    v.kind = Value::Kind::kOpOutput;
    v.producer = node.id;
    v.output_index = static_cast<int>(o);
    node.outputs.push_back(AddValue(std::move(v)));
  }
  ops_.push_back(std::move(node));
  return ops_.back().outputs;
}

void Graph::MarkOutput(const std::string& name, int value) {
  TESSEL_CHECK(outputs_.count(name) == 0) << "graph '" << name_ << "': output '" << name << "' named twice";
  TESSEL_CHECK(value >= 0 && value < static_cast<int>(values_.size()))
      << "graph '" << name_ << "': output '" << name << "' names value " << value << ", which does not exist";
  outputs_[name] = value;
}

void Graph::MarkGradient(int value) {
  TESSEL_CHECK_CODE(value >= 0 && value < static_cast<int>(values_.size()), StatusCode::kInternal)
      << "graph '" << name_ << "': gradient %" << value << " does not exist";
  gradients_.insert(value);
}

int Graph::InputId(const std::string& name) const {
  auto it = inputs_by_name_.find(name);
  if (it != inputs_by_name_.end()) return it->second;
  std::ostringstream have;
  for (const auto& [n, id] : inputs_by_name_) have << (have.tellp() > 0 ? ", " : "") << n;
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "graph '" << name_ << "' has no input '" << name << "' (inputs: " << have.str() << ")";
}

int Graph::NewValue(const Value& spec) {
  Value v = spec;
  v.kind = Value::Kind::kOpOutput;
  v.name.clear();
  v.producer = -1;
  v.output_index = 0;
  return AddValue(std::move(v));
}

void Graph::SetOps(std::vector<Op> ops) {
  for (Value& v : values_)
    if (v.kind == Value::Kind::kOpOutput) v.producer = -1;
  for (size_t n = 0; n < ops.size(); ++n) {
    Op& op = ops[n];
    op.id = static_cast<int>(n);
    op.kind = KindOf(op.name);
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const int id = op.outputs[o];
      TESSEL_CHECK_CODE(id >= 0 && id < static_cast<int>(values_.size()) &&
                            values_[id].kind == Value::Kind::kOpOutput && values_[id].producer < 0,
                        StatusCode::kInternal)
          << "graph '" << name_ << "': op " << n << " '" << op.name << "' writes value " << id
          << ", which does not exist, is not an op output or has another producer";
      values_[id].producer = op.id;
      values_[id].output_index = static_cast<int>(o);
    }
  }
  ops_ = std::move(ops);
}

void Graph::RedirectOutput(const std::string& name, int value) {
  auto it = outputs_.find(name);
  TESSEL_CHECK_CODE(it != outputs_.end(), StatusCode::kInternal)
      << "graph '" << name_ << "' has no output '" << name << "' to redirect";
  it->second = value;
}

bool Graph::IsLive(int id) const {
  const Value& v = values_.at(static_cast<size_t>(id));
  return v.kind != Value::Kind::kOpOutput || v.producer >= 0;
}

void Verify(const Graph& graph, bool explicit_boxing) {
  std::vector<bool> defined(graph.values().size(), false);
  for (const Value& v : graph.values()) defined[v.id] = v.kind != Value::Kind::kOpOutput;
  for (size_t n = 0; n < graph.ops().size(); ++n) {
    const Op& op = graph.ops()[n];
    auto where = [&] {
      std::ostringstream os;
      os << "graph '" << graph.name() << "': op " << n << " '" << op.name << "' ";
      return os.str();
    };
    TESSEL_CHECK_CODE(op.id == static_cast<int>(n), StatusCode::kInternal) << where() << "has id " << op.id;
    for (int i : op.inputs) {
      TESSEL_CHECK_CODE(i >= 0 && i < static_cast<int>(defined.size()) && defined[i], StatusCode::kInternal)
          << where() << "reads %" << i << ", which is not defined before it";
    }
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const int id = op.outputs[o];
      TESSEL_CHECK_CODE(id >= 0 && id < static_cast<int>(defined.size()) && !defined[id] &&
                            graph.value(id).producer == op.id &&
                            graph.value(id).output_index == static_cast<int>(o),
                        StatusCode::kInternal)
          << where() << "writes %" << id << ", which is defined elsewhere or names another producer";
      defined[id] = true;
    }
    if (op.kind == OpKind::kToGlobal || op.kind == OpKind::kRecv) {
      // A layout change or a stage transfer moves a tensor; it never
      // reshapes or converts one (both stages read the same spec).
      const Value& in = graph.value(op.inputs.at(0));
      const Value& result = graph.value(op.outputs.at(0));
      TESSEL_CHECK_CODE(in.shape == result.shape && in.dtype == result.dtype, StatusCode::kInternal)
          << where() << "moves %" << in.id << " (" << in.SpecString() << ") to %" << result.id << " ("
          << result.SpecString() << "); expected the same shape and dtype on both sides";
    }
    if (op.input_sbp.empty() && op.output_sbp.empty()) continue;  // local, or a layout change (runs whole)
    TESSEL_CHECK_CODE(op.input_sbp.size() == op.inputs.size() && op.output_sbp.size() == op.outputs.size(),
                      StatusCode::kInternal)
        << where() << "records " << op.input_sbp.size() << " input and " << op.output_sbp.size()
        << " output layouts for " << op.inputs.size() << " inputs and " << op.outputs.size() << " outputs";
    const Placement& placement = graph.value(op.inputs.empty() ? op.outputs.at(0) : op.inputs[0]).placement;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const Value& v = graph.value(op.inputs[i]);
      TESSEL_CHECK_CODE(v.placement == placement, StatusCode::kInternal)
          << where() << "reads %" << v.id << " on " << v.placement << " and runs on " << placement;
      TESSEL_CHECK_CODE(!explicit_boxing || v.nd_sbp == op.input_sbp[i], StatusCode::kInternal)
          << where() << "reads %" << v.id << " as " << op.input_sbp[i] << " but it is " << v.nd_sbp
          << " and no boxing op converts it";
    }
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const Value& v = graph.value(op.outputs[o]);
      TESSEL_CHECK_CODE(v.placement == placement && v.nd_sbp == op.output_sbp[o], StatusCode::kInternal)
          << where() << "writes %" << v.id << " as " << v.nd_sbp << " on " << v.placement
          << "; its signature says " << op.output_sbp[o] << " on " << placement;
    }
  }
  for (const auto& [name, id] : graph.outputs()) {
    TESSEL_CHECK_CODE(id >= 0 && id < static_cast<int>(defined.size()) && defined[id], StatusCode::kInternal)
        << "graph '" << graph.name() << "': result '" << name << "' is %" << id << ", which no op produces";
  }
}

std::string Graph::ToText() const {
  std::ostringstream os;
  os << "graph " << name_ << " {\n";
  for (const Value& v : values_) {
    if (v.kind == Value::Kind::kOpOutput) continue;
    os << "  %" << v.id << " = " << KindName(v.kind) << " \"" << v.name << "\" : " << v.SpecString() << "\n";
  }
  for (const Op& op : ops_) {
    os << "  ";
    for (size_t o = 0; o < op.outputs.size(); ++o) os << (o ? ", " : "") << "%" << op.outputs[o];
    os << (op.outputs.empty() ? "" : " = ") << op.name << "(";
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      os << (i ? ", " : "") << "%" << op.inputs[i];
      if (i < op.input_sbp.size()) os << " as " << op.input_sbp[i];
    }
    os << ")";
    bool first = true;
    for (const auto& [k, a] : op.attrs.values()) {
      os << (first ? " {" : ", ") << k << "=" << AttrString(a);
      first = false;
    }
    if (!first) os << "}";
    if (op.layer >= 0) os << " [layer " << op.layer << "]";
    if (op.stage >= 0) os << " [stage " << op.stage << "]";
    if (op.micro_batch >= 0 && micro_batch_units_ > 1)
      os << " [each of " << micro_batch_units_ << " micro-batches]";
    else if (op.micro_batch >= 0)
      os << " [micro-batch " << op.micro_batch << "]";
    if (op.recompute_region >= 0)
      os << (op.backward ? " [recompute " : " [checkpoint ") << op.recompute_region << "]";
    for (size_t o = 0; o < op.outputs.size(); ++o)
      os << (o ? ", " : " : ") << values_[static_cast<size_t>(op.outputs[o])].SpecString();
    os << "\n";
  }
  for (const auto& [name, id] : outputs_) os << "  output \"" << name << "\" = %" << id << "\n";
  for (int id : gradients_)
    if (IsLive(id)) os << "  gradient %" << id << "\n";
  os << "}\n";
  return os.str();
}

std::string Graph::ToDot() const {
  std::ostringstream os;
  os << "digraph " << Quoted(name_) << " {\n  node [fontname=\"monospace\", fontsize=10];\n";
  // Where each value comes from: an op node or its own source node.
  auto source = [&](int id) {
    const Value& v = values_[static_cast<size_t>(id)];
    std::string s = v.kind == Value::Kind::kOpOutput ? "op" : "v";
    s += std::to_string(v.kind == Value::Kind::kOpOutput ? v.producer : id);
    return s;
  };
  for (const Value& v : values_) {
    if (v.kind == Value::Kind::kOpOutput) continue;
    os << "  v" << v.id << " [shape=ellipse, label=" << Quoted(std::string(KindName(v.kind)) + " " + v.name)
       << "];\n";
  }
  for (const Op& op : ops_) {
    std::string label = std::to_string(op.id) + ": " + op.name;
    if (op.layer >= 0) label += " [layer " + std::to_string(op.layer) + "]";
    if (op.stage >= 0) label += " [stage " + std::to_string(op.stage) + "]";
    if (op.micro_batch >= 0)
      label += micro_batch_units_ > 1 ? " [each mb]" : " [mb " + std::to_string(op.micro_batch) + "]";
    if (op.recompute_region >= 0)
      label += (op.backward ? " [recompute " : " [checkpoint ") + std::to_string(op.recompute_region) + "]";
    os << "  op" << op.id << " [shape=box, label=" << Quoted(label) << "];\n";
    for (int i : op.inputs)
      os << "  " << source(i) << " -> op" << op.id << " [label=" << Quoted(values_[i].SpecString()) << "];\n";
  }
  int n = 0;
  for (const auto& [name, id] : outputs_) {
    os << "  out" << n << " [shape=plaintext, label=" << Quoted(name) << "];\n";
    os << "  " << source(id) << " -> out" << n++ << ";\n";
  }
  os << "}\n";
  return os.str();
}

void Graph::ToProto(proto::GraphProto* out) const {
  out->Clear();
  out->set_name(name_);
  for (const Value& v : values_) {
    if (!IsLive(v.id)) continue;
    proto::ValueProto* p = out->add_values();
    p->set_id(v.id);
    p->set_kind(v.kind == Value::Kind::kInput      ? proto::ValueProto::INPUT
                : v.kind == Value::Kind::kVariable ? proto::ValueProto::VARIABLE
                                                   : proto::ValueProto::OP_OUTPUT);
    p->set_name(v.name);
    for (int64_t d : v.shape.dims()) p->add_shape(d);
    p->set_dtype(std::string(DTypeName(v.dtype)));
    if (v.is_global()) {
      p->set_placement(v.placement.ToString());
      p->set_nd_sbp(v.nd_sbp.ToString());
    }
    p->set_producer(v.producer);
    p->set_output_index(v.output_index);
  }
  for (const Op& op : ops_) {
    proto::OpProto* p = out->add_ops();
    p->set_id(op.id);
    p->set_op(op.name);
    for (const auto& [k, a] : op.attrs.values()) {
      proto::NamedAttr* named = p->add_attrs();
      named->set_name(k);
      proto::AttrProto& attr = *named->mutable_value();
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, bool>) {
              attr.set_b(x);
            } else if constexpr (std::is_same_v<T, int64_t>) {
              attr.set_i(x);
            } else if constexpr (std::is_same_v<T, double>) {
              attr.set_f(x);
            } else if constexpr (std::is_same_v<T, std::string>) {
              attr.set_s(x);
            } else {
              for (int64_t i : x) attr.mutable_ints()->add_values(i);
            }
          },
          a);
    }
    for (int i : op.inputs) p->add_inputs(i);
    for (int o : op.outputs) p->add_outputs(o);
    for (const NdSbp& s : op.input_sbp) p->add_input_sbp(s.ToString());
    for (const NdSbp& s : op.output_sbp) p->add_output_sbp(s.ToString());
    if (op.micro_batch >= 0) p->set_micro_batch(op.micro_batch);
    p->set_backward(op.backward);
    if (op.recompute_region >= 0) p->set_recompute_region(op.recompute_region);
    if (op.layer >= 0) p->set_layer(op.layer);
    if (op.stage >= 0) p->set_stage(op.stage);
  }
  for (int id : gradients_)
    if (IsLive(id)) out->add_gradients(id);
  if (micro_batch_units_ > 1) out->set_micro_batch_units(micro_batch_units_);
  for (const auto& [name, id] : outputs_) {
    proto::NamedOutput* o = out->add_outputs();
    o->set_name(name);
    o->set_value(id);
  }
}

std::vector<std::vector<int>> Predecessors(const Graph& graph) {
  const std::vector<Op>& ops = graph.ops();
  std::vector<std::vector<int>> preds(ops.size()), readers(graph.values().size());
  for (const Op& op : ops) {
    for (int in : op.inputs) {
      const int producer = graph.value(in).producer;
      if (producer >= 0) preds[op.id].push_back(producer);
      readers[in].push_back(op.id);
    }
  }
  for (const Op& op : ops) {
    for (int i : GetOpDef(op.name).mutates) {
      for (int reader : readers[op.inputs.at(static_cast<size_t>(i))]) {
        if (reader < op.id) preds[op.id].push_back(reader);
        if (reader > op.id) preds[reader].push_back(op.id);
      }
    }
  }
  return preds;
}

std::vector<int> PriorityTopologicalOrder(const std::vector<std::vector<int>>& preds,
                                          const std::vector<int64_t>& priority) {
  std::vector<int> begin(preds.size() + 1, 0), flat;
  for (size_t to = 0; to < preds.size(); ++to) {
    flat.insert(flat.end(), preds[to].begin(), preds[to].end());
    begin[to + 1] = static_cast<int>(flat.size());
  }
  return PriorityTopologicalOrder(begin, flat, priority);
}

std::vector<int> PriorityTopologicalOrder(const std::vector<int>& pred_begin, const std::vector<int>& preds,
                                          const std::vector<int64_t>& priority) {
  const size_t n = priority.size();
  TESSEL_CHECK_CODE(pred_begin.size() == n + 1 && static_cast<size_t>(pred_begin.back()) == preds.size(),
                    StatusCode::kInternal)
      << "topological order of " << n << " nodes given " << pred_begin.size() - 1 << " lists of predecessors";
  // Successors in one array, by node (counted, then filled).
  std::vector<int> successor_begin(n + 1, 0), waiting(n, 0);
  for (int from : preds) ++successor_begin[static_cast<size_t>(from) + 1];
  for (size_t i = 0; i < n; ++i) successor_begin[i + 1] += successor_begin[i];
  std::vector<int> successors(preds.size()), filled(successor_begin.begin(), successor_begin.end() - 1);
  for (size_t to = 0; to < n; ++to) {
    for (int k = pred_begin[to]; k < pred_begin[to + 1]; ++k) {
      successors[static_cast<size_t>(filled[static_cast<size_t>(preds[static_cast<size_t>(k)])]++)] =
          static_cast<int>(to);
      ++waiting[to];
    }
  }
  using Ready = std::pair<int64_t, int>;  // (priority, node)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (waiting[i] == 0) ready.emplace(priority[i], static_cast<int>(i));
  std::vector<int> order;
  order.reserve(n);
  while (!ready.empty()) {
    const int i = ready.top().second;
    ready.pop();
    order.push_back(i);
    for (int k = successor_begin[static_cast<size_t>(i)]; k < successor_begin[static_cast<size_t>(i) + 1];
         ++k) {
      const int next = successors[static_cast<size_t>(k)];
      if (--waiting[static_cast<size_t>(next)] == 0) ready.emplace(priority[static_cast<size_t>(next)], next);
    }
  }
  return order;
}

}  // namespace tessel::ir
