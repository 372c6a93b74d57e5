// Stage assignment: under pipeline parallelism each stage's ranks run their
// own layers, and activations (forward) and their gradients (backward) cross
// from one stage's ranks to the next's. Boxing insertion leaves each such
// crossing as a to_global between two placements with no rank in common;
// here it becomes a `send` op on the source stage and a `recv` op on the
// destination, so each rank's plan holds only its own half and an executor
// sees the boundary (the actor runtime's cross-rank edges). Every op is
// tagged with its stage, and an op of layer l that computes on another
// stage's ranks is refused before anything runs: its layer's parameters
// were put on the wrong placement, which would otherwise cost a silent
// round trip between stages.
#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/join.h"
#include "graph/boxing_executor.h"
#include "graph/passes/passes.h"
#include "sbp/boxing_plan.h"
#include "sbp/global_tensor.h"

namespace tessel::passes {
namespace {

// "{0, 1}": ranks or layers.
template <typename T>
std::string ListString(const std::vector<T>& items) {
  return std::string("{").append(Join(items)).append("}");
}

// send: this rank's parts of its input go to the ranks of the destination
// placement (attrs). No result; it runs on the source stage.
std::vector<Tensor> RunSend(const std::vector<Tensor>& in, const Attrs& attrs) {
  SendSlices(in.at(0), Placement::Parse(attrs.Get<std::string>("placement")),
             NdSbp::Parse(attrs.Get<std::string>("nd_sbp")));
  return {};
}

// recv: the input as laid out on the destination stage (attrs), received
// from the source stage's ranks; the input is read for its spec only (off
// its placement a rank holds no data of it).
std::vector<Tensor> RunRecv(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in.at(0);
  return {ReceiveSlices(x.placement(), x.nd_sbp(), x.shape(), x.dtype(),
                        Placement::Parse(attrs.Get<std::string>("placement")),
                        NdSbp::Parse(attrs.Get<std::string>("nd_sbp")))};
}

void EnsureStageTransferOps() {
  static const bool registered = [] {
    OpDef send;
    send.name = "send";
    send.inputs = {"x"};
    send.infer = [](const std::vector<TensorSpec>&, const Attrs&) { return std::vector<TensorSpec>{}; };
    send.run = RunSend;
    send.communicates = true;
    RegisterOp(std::move(send));
    OpDef recv;
    recv.name = "recv";
    recv.inputs = {"x"};
    recv.infer = [](const std::vector<TensorSpec>& in, const Attrs&) { return in; };
    recv.run = RunRecv;
    recv.communicates = true;
    RegisterOp(std::move(recv));
    return true;
  }();
  (void)registered;
}

class Stages {
 public:
  Stages(const std::vector<std::vector<int>>& stage_ranks, const std::vector<int64_t>& layer_stages)
      : stage_ranks_(stage_ranks), layer_stages_(layer_stages) {
    for (size_t s = 0; s < stage_ranks.size(); ++s) {
      for (int r : stage_ranks[s]) {
        auto [it, added] = stage_of_rank_.emplace(r, static_cast<int>(s));
        TESSEL_CHECK(added) << "pipeline stages " << it->second << " and " << s << " both hold rank " << r
                            << "; expected each rank in one stage";
      }
    }
    for (size_t l = 0; l < layer_stages.size(); ++l) {
      TESSEL_CHECK(layer_stages[l] >= 0 && layer_stages[l] < static_cast<int64_t>(stage_ranks.size()))
          << "layer " << l << " is given stage " << layer_stages[l] << "; expected 0.."
          << stage_ranks.size() - 1;
    }
    for (size_t s = 0; s < stage_ranks.size() && !layer_stages.empty(); ++s) {
      TESSEL_CHECK(std::find(layer_stages.begin(), layer_stages.end(), static_cast<int64_t>(s)) !=
                   layer_stages.end())
          << "pipeline stage " << s << " (ranks " << ListString(stage_ranks[s]) << ") is given none of the "
          << layer_stages.size()
          << " layers; expected every stage to hold one or more (its ranks would only idle)";
    }
  }

  // The stage holding all of `placement`'s ranks, or -1 (several or none).
  int Of(const Placement& placement) const {
    int stage = -2;
    for (int r : placement.ranks()) {
      auto it = stage_of_rank_.find(r);
      const int s = it == stage_of_rank_.end() ? -1 : it->second;
      if (stage == -2) stage = s;
      if (s != stage) return -1;
    }
    return stage < 0 ? -1 : stage;
  }

  // Why `placement` has no stage, for an error.
  std::string WhyNone(const Placement& placement) const {
    std::map<int, std::vector<int>> by_stage;
    for (int r : placement.ranks()) {
      auto it = stage_of_rank_.find(r);
      by_stage[it == stage_of_rank_.end() ? -1 : it->second].push_back(r);
    }
    std::ostringstream os;
    os << "its ranks lie";
    for (const auto& [s, ranks] : by_stage)
      os << (s < 0 ? " outside every stage: " : " in stage " + std::to_string(s) + ": ") << ListString(ranks)
         << ";";
    return os.str();
  }

  // The stage layer `layer` belongs to; throws naming the op for a layer
  // beyond the stages.
  int OfLayer(const ir::Graph& graph, const ir::Op& op) const {
    TESSEL_CHECK(op.layer < static_cast<int64_t>(layer_stages_.size()))
        << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' belongs to layer_idx "
        << op.layer << ", beyond the pipeline's layers: stages are given for layers 0.."
        << static_cast<int64_t>(layer_stages_.size()) - 1;
    return static_cast<int>(layer_stages_[static_cast<size_t>(op.layer)]);
  }

  const std::vector<int>& ranks(int stage) const { return stage_ranks_[static_cast<size_t>(stage)]; }
  bool has_layers() const { return !layer_stages_.empty(); }

 private:
  const std::vector<std::vector<int>>& stage_ranks_;
  const std::vector<int64_t>& layer_stages_;
  std::map<int, int> stage_of_rank_;
};

// The stage an op (not a crossing) runs on: the one holding every global
// value it reads and writes; -1 when it touches none (a local op).
int OpStage(const ir::Graph& graph, const ir::Op& op, const Stages& stages) {
  int stage = -1;
  int first = -1;  // the value that set `stage`
  auto visit = [&](int id) {
    const ir::Value& v = graph.value(id);
    if (!v.is_global()) return;
    const int s = stages.Of(v.placement);
    TESSEL_CHECK(s >= 0) << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' uses %"
                         << id << " on " << v.placement
                         << ", which is on no single pipeline stage: " << stages.WhyNone(v.placement)
                         << " expected one stage's ranks";
    if (stage < 0) stage = s, first = id;
    TESSEL_CHECK(s == stage) << "graph '" << graph.name() << "': op " << op.id << " '" << op.name
                             << "' uses %" << first << " on stage " << stage << " and %" << id << " on stage "
                             << s << "; an op runs on one stage (values cross stages through send / recv)";
  };
  for (int id : op.outputs) visit(id);
  for (int id : op.inputs) visit(id);
  return stage;
}

// An op inheriting `like`'s tags, on `stage`.
ir::Op Derived(const ir::Op& like, std::string name, int stage) {
  ir::Op op;
  op.name = std::move(name);
  op.micro_batch = like.micro_batch;
  op.backward = like.backward;
  op.recompute_region = like.recompute_region;
  op.layer = like.layer;
  op.stage = stage;
  return op;
}

// `like`'s shape and dtype laid out as `nd_sbp` on `placement`.
ir::Value Laid(const ir::Value& like, const Placement& placement, const NdSbp& nd_sbp) {
  ir::Value v = like;
  v.placement = placement;
  v.nd_sbp = nd_sbp;
  return v;
}

}  // namespace

void AssignStages(ir::Graph& graph, const std::vector<std::vector<int>>& stage_ranks,
                  const std::vector<int64_t>& layer_stages) {
  if (stage_ranks.empty()) return;
  EnsureStageTransferOps();
  const Stages stages(stage_ranks, layer_stages);
  std::vector<ir::Op> out;
  out.reserve(graph.ops().size());
  const std::vector<ir::Op> ops = graph.ops();  // NewValue below may grow the graph's tables
  // The forward pass: ops of a micro-batch's forward, or (without
  // micro-batches) the ops before the first gradient op. Clipping and the
  // optimizer come after and may combine values of every stage.
  int first_backward = static_cast<int>(ops.size());
  for (const ir::Op& op : ops)
    if (op.backward) first_backward = std::min(first_backward, op.id);
  std::vector<char> layer_seen(layer_stages.size(), 0);
  for (const ir::Op& op : ops) {
    if (op.layer >= 0 && op.layer < static_cast<int64_t>(layer_seen.size()))
      layer_seen[static_cast<size_t>(op.layer)] = 1;
    if (op.name == "to_global") {
      const ir::Value in = graph.value(op.inputs[0]);
      const ir::Value result = graph.value(op.outputs[0]);
      const int from = stages.Of(in.placement), to = stages.Of(result.placement);
      const bool forward = !op.backward && (op.micro_batch >= 0 || op.id < first_backward);
      TESSEL_CHECK(!forward || from < 0 || to < 0 || to >= from)
          << "graph '" << graph.name() << "': op " << op.id << " moves %" << in.id << " (" << in.SpecString()
          << ") from stage " << from << " back to stage " << to << " in the forward pass"
          << (op.layer >= 0 ? " (read by layer " + std::to_string(op.layer) + ")" : std::string())
          << "; expected activations to flow to the same or a later stage (place each layer on a stage no "
             "earlier than the layer before it)";
      if (from >= 0 && to >= 0 && from != to) {
        // A crossing: what the source side does first (collectives on its
        // own ranks), the transfer itself, what the destination does after.
        const BoxingPlan plan =
            PlanBoxing(in.placement, in.nd_sbp, result.placement, result.nd_sbp, in.shape, in.dtype);
        auto transfer = std::find_if(plan.steps.begin(), plan.steps.end(),
                                     [](const BoxingStep& s) { return s.op == BoxingOp::kSliceTransfer; });
        TESSEL_CHECK_CODE(transfer != plan.steps.end() && transfer->from_placement == in.placement &&
                              transfer->to_placement == result.placement,
                          StatusCode::kInternal)
            << "graph '" << graph.name() << "': op " << op.id << " moves %" << in.id << " from stage " << from
            << " to stage " << to
            << " but its boxing plan has no transfer between the stages: " << plan.Explain();
        int sent = in.id;
        if (transfer->from != in.nd_sbp) {
          ir::Op before = Derived(op, "to_global", from);
          before.attrs = Attrs{{"placement", in.placement.ToString()}, {"nd_sbp", transfer->from.ToString()}};
          before.inputs = {in.id};
          sent = graph.NewValue(Laid(in, in.placement, transfer->from));
          before.outputs = {sent};
          out.push_back(std::move(before));
        }
        const Attrs destination{{"placement", result.placement.ToString()},
                                {"nd_sbp", transfer->to.ToString()}};
        ir::Op send = Derived(op, "send", from);
        send.attrs = destination;
        send.inputs = {sent};
        out.push_back(std::move(send));
        ir::Op recv = Derived(op, "recv", to);
        recv.attrs = destination;
        recv.inputs = {sent};
        if (transfer->to == result.nd_sbp) {
          recv.outputs = {result.id};
          out.push_back(std::move(recv));
        } else {
          const int received = graph.NewValue(Laid(in, result.placement, transfer->to));
          recv.outputs = {received};
          out.push_back(std::move(recv));
          ir::Op after = Derived(op, "to_global", to);
          after.attrs = op.attrs;
          after.inputs = {received};
          after.outputs = {result.id};
          out.push_back(std::move(after));
        }
        continue;
      }
    }
    ir::Op staged = op;
    staged.stage = OpStage(graph, op, stages);
    if (op.layer >= 0 && stages.has_layers()) {
      const int want = stages.OfLayer(graph, op);
      TESSEL_CHECK(staged.stage < 0 || staged.stage == want)
          << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' of layer " << op.layer
          << " computes on stage " << staged.stage << " (ranks " << ListString(stages.ranks(staged.stage))
          << "), which is not its stage: layer " << op.layer << " belongs to stage " << want << " (ranks "
          << ListString(stages.ranks(want)) << "); place the layer's parameters on its stage's ranks";
    }
    out.push_back(std::move(staged));
  }
  // Every layer the stages were given built ops: a model that builds fewer
  // layers than its pipeline config says would otherwise train a shorter
  // model without a word.
  std::vector<int64_t> missing;
  for (size_t l = 0; l < layer_seen.size(); ++l)
    if (!layer_seen[l]) missing.push_back(static_cast<int64_t>(l));
  TESSEL_CHECK(missing.empty() || missing.size() == layer_seen.size())
      << "graph '" << graph.name() << "': stages are given for " << layer_seen.size()
      << " layers but layer(s) " << ListString(missing)
      << " recorded no ops; expected the model to build every layer of its pipeline config "
         "(pipeline_num_layers)";
  graph.SetOps(std::move(out));
}

}  // namespace tessel::passes
