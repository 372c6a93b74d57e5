#include "graph/passes/step_runs.h"

#include <algorithm>

#include "core/comm/communicator.h"
#include "core/error.h"
#include "ops/op_def.h"

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
    if (op.kind == ir::OpKind::kSend) holds |= graph.value(op.inputs[0]).placement.Contains(rank);
    if (holds) held.insert(op.stage);
  }
  return held;
}

StepRuns::StepRuns(const ir::Graph& graph, const std::vector<char>* numbered) : graph_(&graph) {
  const std::vector<ir::Op>& ops = graph.ops();
  const size_t num_values = graph.values().size();
  const bool units = graph.micro_batch_units() > 1;
  micro_batches_ = units ? graph.micro_batch_units() : 1;
  unit_.assign(ops.size(), 0);
  after_.assign(ops.size(), 0);
  sum_.assign(ops.size(), 0);
  if (numbered != nullptr) {
    TESSEL_CHECK_CODE(numbered->size() == ops.size(), StatusCode::kInternal)
        << "graph '" << graph.name() << "': " << numbered->size() << " op marks for " << ops.size() << " ops";
    numbered_ = *numbered;
  } else {
    numbered_.assign(ops.size(), 1);
  }
  extra_.assign(num_values, kOneSlot);
  for (const ir::Op& op : ops) {
    if (op.attrs.Has("tag")) tags_ = std::max(tags_, op.attrs.Get<int64_t>("tag") + 1);
    if (!units || op.micro_batch < 0) continue;
    unit_[static_cast<size_t>(op.id)] = 1;
    unit_ops_.push_back(op.id);
    sum_[static_cast<size_t>(op.id)] = op.kind == ir::OpKind::kMicroBatchSum;
  }
  first_run_.resize(ops.size());
  for (const ir::Op& op : ops) {
    first_run_[static_cast<size_t>(op.id)] = runs_;
    if (this->numbered(op.id)) runs_ += RunsOf(op.id);
  }
  slots_ = static_cast<int>(num_values);
  if (!units) return;
  const int n = micro_batches_;
  TESSEL_CHECK_CODE(tags_ * n < (int64_t{1} << comm::Communicator::kSeqBits), StatusCode::kInvalidArgument)
      << "graph '" << graph.name() << "': " << tags_ << " stage transfers per micro-batch over " << n
      << " micro-batches need " << tags_ * n << " message tags; a step can tag "
      << (int64_t{1} << comm::Communicator::kSeqBits) << " (use fewer micro-batches or stages)";

  // What the units compute per micro-batch (a sum's running values
  // included), what they update in place, and which values are the sums.
  std::vector<char> written(num_values, 0), summed(num_values, 0), late(num_values, 0);
  int first = -1, last = -1;  // the first and last unit op
  for (const ir::Op& op : ops) {
    if (!unit(op.id)) continue;
    if (first < 0) first = op.id;
    last = op.id;
    for (int o : op.outputs) {
      extra_[static_cast<size_t>(o)] = kNoSlotsHere;
      if (sum_[static_cast<size_t>(op.id)]) summed[static_cast<size_t>(o)] = late[static_cast<size_t>(o)] = 1;
    }
    for (int i : GetOpDef(op.name).mutates)
      written[static_cast<size_t>(op.inputs.at(static_cast<size_t>(i)))] = 1;
  }
  for (const auto& [name, id] : graph.outputs())
    TESSEL_CHECK_CODE(!per_micro_batch(id) || summed[static_cast<size_t>(id)], StatusCode::kInternal)
        << "graph '" << graph.name() << "': result '" << name << "' is %" << id
        << ", which each micro-batch computes; a result of the units must be summed (micro_batch_sum)";
  for (const ir::Op& op : ops) {
    if (unit(op.id)) {
      for (int i : op.inputs)
        TESSEL_CHECK_CODE(!summed[static_cast<size_t>(i)], StatusCode::kInternal)
            << "graph '" << graph.name() << "': " << OpName(op) << " of the micro-batch units reads %" << i
            << ", a sum over the micro-batches";
      continue;
    }
    // An op of the step: it reads whole sums, never a micro-batch's value.
    bool reads_sum = false;
    for (int i : op.inputs) {
      TESSEL_CHECK_CODE(!per_micro_batch(i) || summed[static_cast<size_t>(i)], StatusCode::kInternal)
          << "graph '" << graph.name() << "': " << OpName(op) << " runs once per step and reads %" << i
          << ", a micro-batch's value";
      reads_sum |= late[static_cast<size_t>(i)] != 0;
    }
    if (op.id < first) continue;
    if (op.id > last || reads_sum) {
      after_[static_cast<size_t>(op.id)] = 1;
      for (int o : op.outputs) late[static_cast<size_t>(o)] = 1;
      continue;
    }
    // One a pass put among the units, run before them (a variable's
    // layout change a unit reads, say).
    for (int i : op.inputs)
      TESSEL_CHECK_CODE(!written[static_cast<size_t>(i)], StatusCode::kInternal)
          << "graph '" << graph.name() << "': " << OpName(op) << " runs once per step among the micro-batch "
          << "units and reads %" << i << ", which a unit updates in place";
    TESSEL_CHECK_CODE(GetOpDef(op.name).mutates.empty(), StatusCode::kInternal)
        << "graph '" << graph.name() << "': " << OpName(op)
        << " updates a value in place among the micro-batch units; it runs once per step";
  }
  // The extra slots of the units' values the numbered ops read or write.
  auto number = [&](int value) {
    int& extra = extra_[static_cast<size_t>(value)];
    if (extra != kNoSlotsHere) return;
    extra = slots_;
    slots_ += n - 1;
  };
  for (const ir::Op& op : ops) {
    if (!this->numbered(op.id)) continue;
    for (int o : op.outputs) number(o);
    for (int i : op.inputs) number(i);
  }
}

int StepRuns::Slot(int value, int micro_batch) const {
  const int extra = extra_[static_cast<size_t>(value)];
  if (extra == kOneSlot) return value;
  const int k = micro_batch < 0 ? micro_batches_ - 1 : micro_batch;
  if (k == 0) return value;
  TESSEL_CHECK_CODE(extra != kNoSlotsHere, StatusCode::kInternal)
      << "graph '" << graph_->name() << "': %" << value << " of micro-batch " << k
      << " has no slot: no op numbered here reads or writes it";
  return extra + k - 1;
}

void StepRuns::InputSlots(const ir::Op& op, int micro_batch, std::vector<int>* slots) const {
  slots->clear();
  const bool is_unit = unit(op.id);
  if (is_unit && sum_[static_cast<size_t>(op.id)] && micro_batch > 0)
    slots->push_back(Slot(op.outputs.at(0), micro_batch - 1));
  for (int i : op.inputs) slots->push_back(Slot(i, is_unit ? micro_batch : -1));
}

std::vector<OpRun> StepRuns::ProgramOrder(const std::vector<char>* runs) const {
  const std::vector<ir::Op>& ops = graph_->ops();
  auto wanted = [&](const ir::Op& op) {
    return numbered(op.id) && (runs == nullptr || (*runs)[static_cast<size_t>(op.id)] != 0);
  };
  std::vector<OpRun> order;
  order.reserve(static_cast<size_t>(runs_));
  for (const ir::Op& op : ops)
    if (!unit(op.id) && !after_units(op.id) && wanted(op)) order.push_back({op.id, op.micro_batch});
  std::vector<int> units;
  for (int id : unit_ops_)
    if (wanted(ops[static_cast<size_t>(id)])) units.push_back(id);
  for (int k = 0; k < micro_batches_; ++k)
    for (int id : units) order.push_back({id, k});
  for (const ir::Op& op : ops)
    if (after_units(op.id) && wanted(op)) order.push_back({op.id, op.micro_batch});
  return order;
}

}  // namespace tessel::passes
