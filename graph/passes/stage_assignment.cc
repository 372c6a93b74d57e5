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
//
// Under an interleaved pipeline the layers name virtual stages, several on
// each stage's ranks; an op's stage is then its virtual stage, so the
// executor knows which of its rank's model chunks a unit belongs to. Each
// send / recv pair carries its own message tag: the chunks' transfers
// between two ranks need not run in the same order on both.
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
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

}  // namespace

std::optional<uint32_t> StageTransferTag(const Attrs& attrs) {
  if (!attrs.Has("tag")) return std::nullopt;
  return comm::Communicator::MakeTag(comm::Communicator::kStageTransferChannel,
                                     static_cast<uint32_t>(attrs.Get<int64_t>("tag")));
}

namespace {

// send: this rank's parts of its input go to the ranks of the destination
// placement (attrs). No result; it runs on the source stage.
std::vector<Tensor> RunSend(const std::vector<Tensor>& in, const Attrs& attrs) {
  SendSlices(in.at(0), Placement::Parse(attrs.Get<std::string>("placement")),
             NdSbp::Parse(attrs.Get<std::string>("nd_sbp")), StageTransferTag(attrs));
  return {};
}

// recv: the input as laid out on the destination stage (attrs), received
// from the source stage's ranks; the input is read for its spec only (off
// its placement a rank holds no data of it).
std::vector<Tensor> RunRecv(const std::vector<Tensor>& in, const Attrs& attrs) {
  const Tensor& x = in.at(0);
  return {ReceiveSlices(x.placement(), x.nd_sbp(), x.shape(), x.dtype(),
                        Placement::Parse(attrs.Get<std::string>("placement")),
                        NdSbp::Parse(attrs.Get<std::string>("nd_sbp")), StageTransferTag(attrs))};
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

// The pipeline's stages and the layers' (virtual) stages.
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
    const int physical = static_cast<int>(stage_ranks.size());
    int64_t named = physical;
    for (int64_t s : layer_stages) named = std::max(named, s + 1);
    TESSEL_CHECK(named % physical == 0)
        << "the layers' stages " << ListString(layer_stages) << " name " << named << " virtual stages over "
        << physical << " stages; expected a multiple of " << physical
        << " (each stage holding the same number of model chunks)";
    virtual_stages_ = static_cast<int>(named);
    for (size_t l = 0; l < layer_stages.size(); ++l) {
      TESSEL_CHECK(layer_stages[l] >= 0) << "layer " << l << " is given stage " << layer_stages[l]
                                         << "; expected 0.." << virtual_stages_ - 1;
    }
    for (int j = 0; j < virtual_stages_ && !layer_stages.empty(); ++j) {
      TESSEL_CHECK(std::find(layer_stages.begin(), layer_stages.end(), static_cast<int64_t>(j)) !=
                   layer_stages.end())
          << "pipeline " << Name(j) << " (ranks "
          << ListString(stage_ranks[static_cast<size_t>(j % physical)]) << ") is given none of the "
          << layer_stages.size()
          << " layers; expected every stage to hold one or more (its ranks would only idle)";
    }
  }

  // The stage holding all of `placement`'s ranks, or -1 (several or none).
  int Of(const Placement& placement) const {
    // (Once per distinct placement: every op asks, of placements of up to
    // a whole stage's ranks.)
    auto [known, is_new] = stage_of_placement_.try_emplace(placement.id(), -1);
    if (!is_new) return known->second;
    int stage = -2;
    for (int r : placement.ranks()) {
      auto it = stage_of_rank_.find(r);
      const int s = it == stage_of_rank_.end() ? -1 : it->second;
      if (stage == -2) stage = s;
      if (s != stage) return known->second = -1;
    }
    return known->second = stage < 0 ? -1 : stage;
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

  // The (virtual) stage layer `layer` belongs to; throws naming the op for
  // a layer beyond the stages.
  int OfLayer(const ir::Graph& graph, const ir::Op& op) const {
    TESSEL_CHECK(op.layer < static_cast<int64_t>(layer_stages_.size()))
        << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' belongs to layer_idx "
        << op.layer << ", beyond the pipeline's layers: stages are given for layers 0.."
        << static_cast<int64_t>(layer_stages_.size()) - 1;
    return static_cast<int>(layer_stages_[static_cast<size_t>(op.layer)]);
  }

  // Virtual stages on the ranks of stage `stage`: j = stage, stage + p, ...
  int Physical(int virtual_stage) const { return virtual_stage % physical(); }
  int First(int stage) const { return stage; }
  int Last(int stage) const { return virtual_stages_ - physical() + stage; }
  // The first one after `after` (-1: none).
  int Next(int stage, int after) const {
    for (int j = stage; j < virtual_stages_; j += physical())
      if (j > after) return j;
    return -1;
  }
  // The last one before `before` (-1: none).
  int Previous(int stage, int before) const {
    for (int j = Last(stage); j >= 0; j -= physical())
      if (j < before) return j;
    return -1;
  }
  bool chunked() const { return virtual_stages_ > physical(); }
  // "stage 2", or under virtual stages "virtual stage 3 (stage 1)".
  std::string Name(int virtual_stage) const {
    if (!chunked()) return "stage " + std::to_string(virtual_stage);
    return "virtual stage " + std::to_string(virtual_stage) + " (stage " +
           std::to_string(Physical(virtual_stage)) + ")";
  }

  const std::vector<int>& ranks(int stage) const {
    return stage_ranks_[static_cast<size_t>(Physical(stage))];
  }
  bool has_layers() const { return !layer_stages_.empty(); }

 private:
  int physical() const { return static_cast<int>(stage_ranks_.size()); }

  const std::vector<std::vector<int>>& stage_ranks_;
  const std::vector<int64_t>& layer_stages_;
  std::map<int, int> stage_of_rank_;
  mutable std::unordered_map<uint64_t, int> stage_of_placement_;  // by Placement::id()
  int virtual_stages_ = 1;
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
  // The (virtual) stage of the op computing each value, and whether that
  // op is a gradient's; none for inputs, variables and local ops.
  std::map<int, std::pair<int, bool>> value_stage;
  auto stage_of_value = [&](int id) {
    const auto it = value_stage.find(id);
    return it == value_stage.end() ? -1 : it->second.first;
  };
  auto computed = [&](const ir::Op& op) {
    for (int id : op.outputs) value_stage[id] = {op.stage, op.backward};
  };
  int64_t transfers = 0;  // each send / recv pair's message tag
  for (const ir::Op& op : ops) {
    if (op.layer >= 0 && op.layer < static_cast<int64_t>(layer_seen.size()))
      layer_seen[static_cast<size_t>(op.layer)] = 1;
    if (op.kind == ir::OpKind::kToGlobal) {
      const ir::Value in = graph.value(op.inputs[0]);
      const ir::Value result = graph.value(op.outputs[0]);
      const int from_ranks = stages.Of(in.placement), to_ranks = stages.Of(result.placement);
      const bool forward = !op.backward && (op.micro_batch >= 0 || op.id < first_backward);
      if (from_ranks >= 0 && to_ranks >= 0 && from_ranks != to_ranks) {
        // The sending and receiving (virtual) stages. A computed value
        // goes from its producer's to the next one on the receiving ranks
        // (forward: activations flow down the model) or the one before
        // (backward: gradients flow up); a variable or input, which no
        // unit computes, from and to the ranks' first (forward) or last
        // (backward: its first backward unit) virtual stage.
        const int producer_stage = stage_of_value(in.id);
        const bool variable = producer_stage < 0 || stages.Physical(producer_stage) != from_ranks;
        const int from = !variable     ? producer_stage
                         : op.backward ? stages.Last(from_ranks)
                                       : stages.First(from_ranks);
        int to = variable || !(forward || op.backward)
                     ? (op.backward ? stages.Last(to_ranks) : stages.First(to_ranks))
                 : forward ? stages.Next(to_ranks, from)
                           : stages.Previous(to_ranks, from);
        TESSEL_CHECK(!forward || to >= 0)
            << "graph '" << graph.name() << "': op " << op.id << " moves %" << in.id << " ("
            << in.SpecString() << ") from " << stages.Name(from) << " back to stage " << to_ranks
            << " in the forward pass"
            << (op.layer >= 0 ? " (read by layer " + std::to_string(op.layer) + ")" : std::string())
            << "; expected activations to flow to the same or a later stage (place each layer on a stage no "
               "earlier than the layer before it)";
        // A gradient against the flow (no stage before the sender's on the
        // receiving ranks) keeps the plain stages' rule: the receiving
        // stage itself.
        if (to < 0) {
          TESSEL_CHECK_CODE(!stages.chunked(), StatusCode::kInternal)
              << "graph '" << graph.name() << "': op " << op.id << " moves the gradient %" << in.id
              << " from " << stages.Name(from) << " to stage " << to_ranks
              << ", which holds no virtual stage before it; an interleaved pipeline's gradients flow from "
                 "each "
                 "virtual stage to an earlier one";
          to = to_ranks;
        }
        // A crossing: what the source side does first (collectives on its
        // own ranks), the transfer itself, what the destination does after.
        // (Planned once per distinct crossing: every layer boundary of a
        // model is the same one.)
        const BoxingPlan& plan =
            *GetBoxingPlan(in.placement, in.nd_sbp, result.placement, result.nd_sbp, in.shape, in.dtype);
        auto transfer = std::find_if(plan.steps.begin(), plan.steps.end(),
                                     [](const BoxingStep& s) { return s.op == BoxingOp::kSliceTransfer; });
        TESSEL_CHECK_CODE(transfer != plan.steps.end() && transfer->from_placement == in.placement &&
                              transfer->to_placement == result.placement,
                          StatusCode::kInternal)
            << "graph '" << graph.name() << "': op " << op.id << " moves %" << in.id << " from "
            << stages.Name(from) << " to " << stages.Name(to)
            << " but its boxing plan has no transfer between the stages: " << plan.Explain();
        int sent = in.id;
        if (transfer->from != in.nd_sbp) {
          ir::Op before = Derived(op, "to_global", from);
          before.attrs = Attrs{{"placement", in.placement.ToString()}, {"nd_sbp", transfer->from.ToString()}};
          before.inputs = {in.id};
          sent = graph.NewValue(Laid(in, in.placement, transfer->from));
          before.outputs = {sent};
          computed(before);
          out.push_back(std::move(before));
        }
        const Attrs destination{{"placement", result.placement.ToString()},
                                {"nd_sbp", transfer->to.ToString()},
                                {"tag", transfers++}};
        ir::Op send = Derived(op, "send", from);
        send.attrs = destination;
        send.inputs = {sent};
        out.push_back(std::move(send));
        ir::Op recv = Derived(op, "recv", to);
        recv.attrs = destination;
        recv.inputs = {sent};
        if (transfer->to == result.nd_sbp) {
          recv.outputs = {result.id};
          computed(recv);
          out.push_back(std::move(recv));
        } else {
          const int received = graph.NewValue(Laid(in, result.placement, transfer->to));
          recv.outputs = {received};
          computed(recv);
          out.push_back(std::move(recv));
          ir::Op after = Derived(op, "to_global", to);
          after.attrs = op.attrs;
          after.inputs = {received};
          after.outputs = {result.id};
          computed(after);
          out.push_back(std::move(after));
        }
        continue;
      }
    }
    ir::Op staged = op;
    const int ranks_stage = OpStage(graph, op, stages);
    staged.stage = ranks_stage;
    if (ranks_stage >= 0 && op.layer >= 0 && stages.has_layers()) {
      const int want = stages.OfLayer(graph, op);
      TESSEL_CHECK(stages.Physical(want) == ranks_stage)
          << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' of layer " << op.layer
          << " computes on stage " << ranks_stage << " (ranks "
          << ListString(stage_ranks[static_cast<size_t>(ranks_stage)]) << "), which is not its stage: layer "
          << op.layer << " belongs to " << stages.Name(want) << " (ranks " << ListString(stages.ranks(want))
          << "); place the layer's parameters on its stage's ranks";
      staged.stage = want;
    } else if (ranks_stage >= 0 && stages.chunked()) {
      // No layer: the virtual stage on these ranks whose results it waits
      // for last. Forward, the latest one it reads from (a layer's
      // follow-up); in a gradient op, the earliest whose gradients it reads
      // (a sum of a weight's gradients from two chunks: the earlier chunk's
      // backward runs later), else the latest it reads activations from.
      // With none, the ranks' first.
      int latest = -1, earliest_gradient = -1;
      for (int in : op.inputs) {
        const auto it = value_stage.find(in);
        if (it == value_stage.end() || it->second.first < 0 ||
            stages.Physical(it->second.first) != ranks_stage)
          continue;
        const auto [s, gradient] = it->second;
        latest = std::max(latest, s);
        if (gradient) earliest_gradient = earliest_gradient < 0 ? s : std::min(earliest_gradient, s);
      }
      staged.stage = op.backward && earliest_gradient >= 0 ? earliest_gradient
                     : latest >= 0                         ? latest
                                                           : stages.First(ranks_stage);
    }
    computed(staged);
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
