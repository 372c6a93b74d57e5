// Unrolling micro-batch units: what gradient accumulation left once (and
// every pass after it kept so: boxing insertion, stage assignment, gradient
// bucketing work on one micro-batch's ops) becomes the copies an executor
// runs (see passes.h). Each rank copies only the units of its own stages
// (UnrolledForRank); the in-order executor, which runs every op, copies
// them all. Compiling the units once is what keeps the compiler's time
// independent of the micro-batch count; this copy is a plain walk over the
// ops, with no inference.
#include <algorithm>
#include <set>
#include <vector>

#include "core/comm/communicator.h"
#include "core/error.h"
#include "graph/passes/passes.h"

namespace tessel::passes {
namespace {

std::string OpName(const ir::Op& op) {
  return std::string("op ").append(std::to_string(op.id)).append(" '").append(op.name).append("'");
}

}  // namespace

std::set<int> StagesHeldBy(const ir::Graph& graph, int rank) {
  std::set<int> held;
  for (const ir::Op& op : graph.ops()) {
    if (op.stage < 0 || held.count(op.stage)) continue;
    bool holds = false;
    for (int o : op.outputs) holds |= graph.value(o).placement.Contains(rank);
    if (op.name == "send") holds |= graph.value(op.inputs[0]).placement.Contains(rank);
    if (holds) held.insert(op.stage);
  }
  return held;
}

ir::Graph UnrolledForRank(const ir::Graph& graph, int rank) {
  ir::Graph out = graph;
  if (graph.micro_batch_units() <= 1) return out;
  const std::set<int> held = StagesHeldBy(graph, rank);
  std::vector<char> copied(graph.ops().size(), 0);
  for (const ir::Op& op : graph.ops())
    copied[static_cast<size_t>(op.id)] = op.stage < 0 || held.count(op.stage) > 0;
  UnrollMicroBatches(out, &copied);
  return out;
}

void UnrollMicroBatches(ir::Graph& graph, const std::vector<char>* copied) {
  const int n = graph.micro_batch_units();
  if (n <= 1) {
    graph.set_micro_batch_units(0);
    return;
  }
  // (NewValue below grows the values, never the ops, until SetOps.)
  const std::vector<ir::Op>& ops = graph.ops();
  const size_t num_values = graph.values().size();
  int first = -1, last = -1;  // the first and last unit op
  for (const ir::Op& op : ops) {
    if (op.micro_batch < 0) continue;
    if (first < 0) first = op.id;
    last = op.id;
  }
  // What the units compute per micro-batch (a micro_batch_sum's result is
  // the step's), what they update in place, and what comes of the sums.
  std::vector<char> per_micro(num_values, 0), written(num_values, 0), after_units(num_values, 0);
  for (const ir::Op& op : ops) {
    if (op.micro_batch < 0) continue;
    for (int o : op.outputs)
      (op.name == "micro_batch_sum" ? after_units : per_micro)[static_cast<size_t>(o)] = 1;
    for (int i : GetOpDef(op.name).mutates)
      written[static_cast<size_t>(op.inputs.at(static_cast<size_t>(i)))] = 1;
  }
  for (const auto& [name, id] : graph.outputs())
    TESSEL_CHECK_CODE(!per_micro[static_cast<size_t>(id)], StatusCode::kInternal)
        << "graph '" << graph.name() << "': result '" << name << "' is %" << id
        << ", which each micro-batch computes; a result of the units must be summed (micro_batch_sum)";
  // Message tags: copy k of a unit's transfer takes its tag + k * (one
  // more than the largest tag), so both sides of a pair agree on every
  // rank and no two copies share one.
  int64_t tags = 0;
  for (const ir::Op& op : ops)
    if (op.attrs.Has("tag")) tags = std::max(tags, op.attrs.Get<int64_t>("tag") + 1);
  TESSEL_CHECK_CODE(tags * n < (int64_t{1} << comm::Communicator::kSeqBits), StatusCode::kInvalidArgument)
      << "graph '" << graph.name() << "': " << tags << " stage transfers per micro-batch over " << n
      << " micro-batches need " << tags * n << " message tags; a step can tag "
      << (int64_t{1} << comm::Communicator::kSeqBits) << " (use fewer micro-batches or stages)";

  std::vector<ir::Op> before, after;
  std::vector<const ir::Op*> units;
  for (const ir::Op& op : ops) {
    if (op.micro_batch >= 0) {
      for (int i : op.inputs)
        TESSEL_CHECK_CODE(!after_units[static_cast<size_t>(i)], StatusCode::kInternal)
            << "graph '" << graph.name() << "': " << OpName(op) << " of the micro-batch units reads %" << i
            << ", a sum over the micro-batches";
      units.push_back(&op);
      continue;
    }
    if (op.id < first) {
      before.push_back(op);
      continue;
    }
    if (op.id > last) {
      after.push_back(op);
      continue;
    }
    // A step op a pass put among the units (a variable's layout change a
    // unit reads, a bucket of averaged gradients).
    bool late = false;
    for (int i : op.inputs) {
      TESSEL_CHECK_CODE(!per_micro[static_cast<size_t>(i)], StatusCode::kInternal)
          << "graph '" << graph.name() << "': " << OpName(op)
          << " runs once per step among the micro-batch units and reads %" << i << ", a micro-batch's value";
      late |= after_units[static_cast<size_t>(i)] != 0;
      TESSEL_CHECK_CODE(late || !written[static_cast<size_t>(i)], StatusCode::kInternal)
          << "graph '" << graph.name() << "': " << OpName(op) << " runs once per step among the micro-batch "
          << "units and reads %" << i << ", which a unit updates in place";
    }
    TESSEL_CHECK_CODE(GetOpDef(op.name).mutates.empty(), StatusCode::kInternal)
        << "graph '" << graph.name() << "': " << OpName(op)
        << " updates a value in place among the micro-batch units; it runs once per step";
    if (late) {
      for (int o : op.outputs) after_units[static_cast<size_t>(o)] = 1;
      after.push_back(op);  // ahead of every op after the last unit (program order)
    } else {
      before.push_back(op);
    }
  }

  std::vector<ir::Op> rewritten = std::move(before);
  rewritten.reserve(rewritten.size() + units.size() * static_cast<size_t>(n) + after.size());
  std::vector<int> copy_of(num_values, -1), running(num_values, -1);
  for (int k = 0; k < n; ++k) {
    std::fill(copy_of.begin(), copy_of.end(), -1);
    for (const ir::Op* unit_op : units) {
      const ir::Op& unit = *unit_op;
      if (copied != nullptr && !(*copied)[static_cast<size_t>(unit.id)]) {
        // Another stage's unit: listed once, reading micro-batch 0's
        // copies, and never run here (what this rank's copies read of it
        // is a transfer's spec).
        if (k == 0) {
          ir::Op once = unit;
          for (int& i : once.inputs)
            if (copy_of[static_cast<size_t>(i)] >= 0) i = copy_of[static_cast<size_t>(i)];
          rewritten.push_back(std::move(once));
        }
        continue;
      }
      if (unit.name == "micro_batch_sum") {
        // The running sum: micro-batch 0's share, then an add per later
        // share; the last one writes the sum's own value.
        const int in = unit.inputs.at(0), out = unit.outputs.at(0);
        const int share = copy_of[static_cast<size_t>(in)];
        TESSEL_CHECK_CODE(share >= 0, StatusCode::kInternal)
            << "graph '" << graph.name() << "': " << OpName(unit) << " sums %" << in
            << ", which no unit before it computes";
        if (k == 0) {
          running[static_cast<size_t>(out)] = share;
          continue;
        }
        ir::Op add = unit;
        add.name = "add";
        add.attrs = Attrs();
        add.micro_batch = k;
        add.inputs = {running[static_cast<size_t>(out)], share};
        if (!unit.input_sbp.empty()) add.input_sbp = {unit.input_sbp[0], unit.input_sbp[0]};
        add.outputs = {k == n - 1 ? out : graph.NewValue(graph.value(out))};
        running[static_cast<size_t>(out)] = add.outputs[0];
        rewritten.push_back(std::move(add));
        continue;
      }
      ir::Op op = unit;
      op.micro_batch = k;
      if (op.name == "micro_batch") op.attrs.Set("index", int64_t{k});
      if (op.attrs.Has("tag")) op.attrs.Set("tag", op.attrs.Get<int64_t>("tag") + k * tags);
      for (int& i : op.inputs)
        if (copy_of[static_cast<size_t>(i)] >= 0) i = copy_of[static_cast<size_t>(i)];
      for (int& o : op.outputs) o = copy_of[static_cast<size_t>(o)] = graph.NewValue(graph.value(o));
      rewritten.push_back(std::move(op));
    }
  }
  for (ir::Op& op : after) rewritten.push_back(std::move(op));
  graph.set_micro_batch_units(0);
  graph.SetOps(std::move(rewritten));
}

}  // namespace tessel::passes
