// Gradient accumulation as a graph rewrite (OneFlow's way: one graph call
// per mini-batch). A traced step is forward, backward, then ops on the
// gradients (clipping, the optimizer), traced on one micro-batch: Graph
// reads each input through a micro_batch op, so every shape (and every
// attribute computed from one) is a micro-batch's. The ops that depend on
// the inputs — forward and backward, and anything else computed from the
// batch — become the micro-batch units: they stay once, standing for each
// micro-batch (Op::micro_batch 0), so the passes after this one work on a
// micro-batch's ops whatever the count; executors run them once per
// micro-batch (step_runs.h). The variables' gradients, which
// autograd marked in the trace, are where the units meet the rest of the
// step: each is summed over the micro-batches (a micro_batch_sum right
// after the op computing its share, so run per micro-batch, a micro-batch's
// activations die before the next one starts)
// and scaled by 1/micro_batches, under the gradient's own id, so the
// optimizer's ops read the average unchanged and run once. With a mean
// loss over equal micro-batches the average is the gradient of the whole
// batch's mean loss: the step equals one on the whole batch. Scalar
// results computed from the batch (the loss) are averaged the same way;
// other batch-dependent results have no single value and are refused.
//
// Order of the rewritten step: the ops that depend on neither the batch nor
// the gradients (hoisted ahead if they sat between forward ops), the
// units, the averages, then the ops on the gradients. Moving ops is only
// allowed where no in-place update (OpDef::mutates) changes what a moved
// op reads; otherwise the op pair is named in the error.
#include <algorithm>
#include <map>
#include <vector>

#include "core/error.h"
#include "graph/passes/passes.h"
#include "graph/sbp_inference.h"

namespace tessel::passes {
namespace {

// The values `op` updates in place.
std::vector<int> Written(const ir::Op& op) {
  std::vector<int> out;
  for (int i : GetOpDef(op.name).mutates) out.push_back(op.inputs.at(static_cast<size_t>(i)));
  return out;
}

GlobalTensorSpec GlobalSpec(const ir::Value& v) { return {v.shape, v.dtype, v.placement, v.nd_sbp}; }

// Appends op `name` on `inputs` (all of `like`'s layout) giving one value of
// `like`'s spec; `output` is its id (-1: a new value). The layouts are the
// ones signature inference picks, which must be `like`'s own (no boxing).
int AddSameLayoutOp(ir::Graph& graph, std::vector<ir::Op>& ops, const std::string& name, const Attrs& attrs,
                    const std::vector<int>& inputs, const ir::Value& like, int output, int micro_batch) {
  ir::Op op;
  op.name = name;
  op.attrs = attrs;
  op.inputs = inputs;
  op.micro_batch = micro_batch;
  // Summing and scaling gradients is part of backward (like.producer: the
  // original op, still in graph.ops() while the pass rewrites).
  op.backward = like.producer >= 0 && graph.ops()[static_cast<size_t>(like.producer)].backward;
  op.layer = like.producer >= 0 ? graph.ops()[static_cast<size_t>(like.producer)].layer : -1;
  if (like.is_global()) {
    auto sig =
        InferNdSignature(GetOpDef(name), attrs,
                         std::vector<GlobalTensorSpec>(inputs.size(), GlobalSpec(like)), like.placement);
    TESSEL_CHECK_CODE(sig->outputs.size() == 1 && sig->outputs[0] == like.nd_sbp &&
                          std::all_of(sig->inputs.begin(), sig->inputs.end(),
                                      [&](const NdSbp& s) { return s == like.nd_sbp; }),
                      StatusCode::kInternal)
        << "gradient accumulation: '" << name << "' on " << like.SpecString() << " would run as "
        << sig->ToString() << ", not in the value's own layout";
    op.input_sbp = sig->inputs;
    op.output_sbp = sig->outputs;
  }
  op.outputs = {output >= 0 ? output : graph.NewValue(like)};
  ops.push_back(std::move(op));
  return ops.back().outputs[0];
}

std::string OpName(const ir::Op& op) {
  return std::string("op ").append(std::to_string(op.id)).append(" '").append(op.name).append("'");
}

}  // namespace

void AccumulateGradients(ir::Graph& graph, int micro_batches) {
  if (micro_batches <= 1) return;
  const int n = micro_batches;
  const std::vector<ir::Op> ops = graph.ops();
  const std::set<int>& gradients = graph.gradients();
  const size_t num_values = graph.values().size();

  // Which values differ between micro-batches (the inputs and what ops
  // compute from them), and which are computed from averaged gradients.
  std::vector<char> per_micro(num_values, 0), from_gradients(num_values, 0), copied(ops.size(), 0);
  for (const ir::Value& v : graph.values()) per_micro[v.id] = v.kind == ir::Value::Kind::kInput;
  // A gradient computed from the batch is averaged before anything reads it.
  auto averaged_gradient = [&](int v) { return per_micro[v] && gradients.count(v) > 0; };
  for (const ir::Op& op : ops) {
    int micro_in = -1, gradient_in = -1;
    for (int i : op.inputs) {
      if (averaged_gradient(i) || from_gradients[i])
        gradient_in = i;
      else if (per_micro[i])
        micro_in = i;
    }
    TESSEL_CHECK(micro_in < 0 || gradient_in < 0)
        << "gradient accumulation: " << OpName(op) << " reads %" << micro_in << " ("
        << graph.value(micro_in).SpecString() << "), which differs per micro-batch, and %" << gradient_in
        << ", which comes from the gradients averaged over the micro-batches; ops after backward may read "
           "the gradients or the batch's values, not both";
    if (micro_in >= 0) {
      copied[op.id] = 1;
      for (int o : op.outputs) per_micro[o] = 1;
    } else if (gradient_in >= 0) {
      for (int o : op.outputs) from_gradients[o] = 1;
    }
  }
  const auto first_copied = std::find(copied.begin(), copied.end(), 1);
  if (first_copied == copied.end()) return;  // nothing reads the batch
  const int first = static_cast<int>(first_copied - copied.begin());
  const int last = static_cast<int>(copied.rend() - std::find(copied.rbegin(), copied.rend(), 1)) - 1;

  // A gradient that sums a share computed on this placement and one moved
  // here from another (a tied weight used on two pipeline stages: the
  // embedding's gradient from the output layer's stage) is averaged before
  // the move: each share is averaged where it is computed, and the move and
  // the sum run once, after the micro-batches — one transfer per step
  // instead of one per micro-batch (moving is linear, so the result is the
  // same up to rounding).
  std::vector<int> readers(num_values, 0);
  for (const ir::Op& op : ops)
    for (int i : op.inputs) ++readers[static_cast<size_t>(i)];
  for (const auto& [name, id] : graph.outputs()) ++readers[static_cast<size_t>(id)];
  std::vector<char> after_averages(ops.size(), 0);  // ops moved after the averages
  std::vector<int> averaged_shares;                 // what is averaged in their place
  for (int g : gradients) {
    if (!averaged_gradient(g) || graph.value(g).producer < 0) continue;
    const ir::Op& sum = ops[static_cast<size_t>(graph.value(g).producer)];
    if (sum.name != "add" || sum.inputs.size() != 2 || sum.inputs[0] == sum.inputs[1]) continue;
    for (int side = 0; side < 2; ++side) {
      const int moved = sum.inputs[static_cast<size_t>(side)],
                here = sum.inputs[static_cast<size_t>(1 - side)];
      const int mover = graph.value(moved).producer;
      if (mover < 0 || readers[static_cast<size_t>(moved)] != 1 || !per_micro[here]) continue;
      const ir::Op& move = ops[static_cast<size_t>(mover)];
      if (move.kind != ir::OpKind::kToGlobal || move.inputs.size() != 1) continue;
      const int share = move.inputs[0];
      const ir::Value& from = graph.value(share);
      if (!per_micro[share] || !from.is_global() || from.placement == graph.value(moved).placement ||
          gradients.count(share) > 0)
        continue;
      copied[move.id] = copied[sum.id] = 0;
      after_averages[move.id] = after_averages[sum.id] = 1;
      averaged_shares.push_back(here);
      averaged_shares.push_back(share);
      break;
    }
  }

  // The values averaged over the micro-batches: the gradients computed from
  // the batch, and results computed from it (floating scalars only).
  std::vector<int> averaged;
  for (int g : gradients) {
    if (!averaged_gradient(g)) continue;
    const int producer = graph.value(g).producer;
    if (producer >= 0 && after_averages[static_cast<size_t>(producer)]) continue;  // its shares are
    averaged.push_back(g);
  }
  for (int share : averaged_shares)
    if (std::find(averaged.begin(), averaged.end(), share) == averaged.end()) averaged.push_back(share);
  for (const auto& [name, id] : graph.outputs()) {
    const ir::Value& v = graph.value(id);
    if (v.kind != ir::Value::Kind::kOpOutput || !per_micro[id] || gradients.count(id) > 0) continue;
    TESSEL_CHECK(v.shape.numel() == 1 && IsFloating(v.dtype))
        << "gradient accumulation: result '" << name << "' (" << v.SpecString()
        << " per micro-batch) is computed from the batch, so each micro-batch has its own; a result computed "
           "from the batch "
           "must be a floating scalar (a mean loss), returned as the average over the "
        << n << " micro-batches";
    if (std::find(averaged.begin(), averaged.end(), id) == averaged.end()) averaged.push_back(id);
  }

  // The trace holds one micro-batch: every input is read through a
  // micro_batch op (index 0), whose copies take the other micro-batches.
  for (const ir::Op& op : ops) {
    for (int i : op.inputs) {
      if (graph.value(i).kind != ir::Value::Kind::kInput) continue;
      TESSEL_CHECK(op.kind == ir::OpKind::kMicroBatch && op.attrs.Get<int64_t>("count") == n)
          << "gradient accumulation over " << n << " micro-batches: " << OpName(op) << " reads input '"
          << graph.value(i).name << "' whole; the trace must read every input through a micro_batch op of "
          << n << " (Graph with GraphOptions::micro_batches does)";
    }
  }

  // Ops that run once now sit before or after all copies: an in-place
  // update must not move across an op that reads or updates its value.
  std::map<int, std::pair<int, int>> copied_access;  // value -> first and last copied op touching it
  std::map<int, std::pair<int, int>> copied_writes;  // value -> first and last copied op updating it
  auto note = [](std::map<int, std::pair<int, int>>& m, int v, int op) {
    auto [it, is_new] = m.try_emplace(v, op, op);
    it->second.first = std::min(it->second.first, op);
    it->second.second = std::max(it->second.second, op);
  };
  for (const ir::Op& op : ops) {
    if (!copied[op.id]) continue;
    for (int i : op.inputs) note(copied_access, i, op.id);
    for (int w : Written(op)) note(copied_writes, w, op.id);
  }
  std::vector<char> late(ops.size(), 0);
  for (const ir::Op& op : ops) {
    if (copied[op.id] || after_averages[op.id]) continue;
    bool reads_gradients = false;
    for (int i : op.inputs) reads_gradients |= averaged_gradient(i) || from_gradients[i];
    late[op.id] = reads_gradients || op.id > last;
    if (op.id < first) continue;  // stays where it was: before every copy
    // Moved after the copies that followed it, or ahead of those before it.
    auto crosses = [&](const std::map<int, std::pair<int, int>>& m, int v) -> int {
      auto it = m.find(v);
      if (it == m.end()) return -1;
      if (late[op.id]) return it->second.second > op.id ? it->second.second : -1;
      return it->second.first < op.id ? it->second.first : -1;
    };
    int other = -1, value = -1;
    for (int w : Written(op)) {
      if ((other = crosses(copied_access, w)) >= 0) {
        value = w;
        break;
      }
    }
    if (other < 0) {
      for (int i : op.inputs)
        if ((other = crosses(copied_writes, i)) >= 0) {
          value = i;
          break;
        }
    }
    TESSEL_CHECK(other < 0) << "gradient accumulation: " << OpName(op) << " and " << OpName(ops[other])
                            << " both use %" << value << " (" << graph.value(value).SpecString()
                            << ") and one updates it in place; the micro-batch copies of "
                            << OpName(ops[other]) << " must run " << (late[op.id] ? "before" : "after") << " "
                            << OpName(op) << ", which changes what one of them reads";
  }

  std::vector<ir::Op> rewritten;
  for (const ir::Op& op : ops)
    if (!copied[op.id] && !late[op.id] && !after_averages[op.id]) rewritten.push_back(op);
  // The units: forward and backward once, standing for every micro-batch
  // (micro_batch 0; executors run them per micro-batch). An averaged value
  // keeps its id for the average the rest of the step reads; what the units
  // compute of it is a new value, its share.
  // Each share is summed right after the op computing it: run so, the
  // per-micro-batch gradient is freed at once, and the last micro-batch's
  // sums are final while its backward goes on with earlier layers (so their
  // buckets can be reduced meanwhile). (A value some unit op updates in
  // place is summed at the end of the units instead, after every update.)
  std::set<int> updated_in_place;
  for (const ir::Op& op : ops)
    if (copied[op.id])
      for (int w : Written(op)) updated_in_place.insert(w);
  std::set<int> summed_at_once, summed_at_end;
  for (int a : averaged) (updated_in_place.count(a) ? summed_at_end : summed_at_once).insert(a);
  std::vector<int> share(num_values, -1);  // averaged value -> its share in the units
  for (int a : averaged) share[static_cast<size_t>(a)] = graph.NewValue(graph.value(a));
  std::map<int, int> sums;  // averaged value -> the sum of its shares
  auto add_sum = [&](int a) {
    sums[a] = AddSameLayoutOp(graph, rewritten, "micro_batch_sum", {{"count", int64_t{n}}},
                              {share[static_cast<size_t>(a)]}, graph.value(a), -1, 0);
  };
  for (const ir::Op& original : ops) {
    if (!copied[original.id]) continue;
    ir::Op op = original;
    op.micro_batch = 0;
    for (int& i : op.inputs)
      if (share[static_cast<size_t>(i)] >= 0) i = share[static_cast<size_t>(i)];
    for (int& o : op.outputs)
      if (share[static_cast<size_t>(o)] >= 0) o = share[static_cast<size_t>(o)];
    rewritten.push_back(std::move(op));
    for (int a : original.outputs)
      if (summed_at_once.count(a)) add_sum(a);
  }
  for (int a : averaged)
    if (summed_at_end.count(a)) add_sum(a);
  for (int a : averaged) {
    AddSameLayoutOp(graph, rewritten, "mul_scalar", {{"scalar", 1.0 / n}}, {sums[a]}, graph.value(a), a, -1);
  }
  // The moves and sums of averaged shares (their ids unchanged: they now
  // read the averages), then the ops on the gradients.
  for (const ir::Op& op : ops)
    if (after_averages[op.id]) rewritten.push_back(op);
  for (const ir::Op& op : ops)
    if (late[op.id]) rewritten.push_back(op);
  graph.set_micro_batch_units(n);
  graph.SetOps(std::move(rewritten));
}

}  // namespace tessel::passes
