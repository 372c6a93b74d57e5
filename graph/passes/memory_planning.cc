#include "graph/passes/memory_planning.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/allocator.h"
#include "graph/global_tensor_ops.h"
#include "graph/passes/passes.h"
#include "graph/passes/step_runs.h"
#include "sbp/global_tensor.h"

namespace tessel::passes {
namespace {

// The input whose storage output `o` of `op` shares (a view, an in-place
// update), by its index among the op's inputs; -1 if it has its own. (A
// running sum is StepRuns's: its first is its share.)
int StorageSource(const ir::Op& op, size_t o) {
  const OpDef& def = GetOpDef(op.name);
  if (o < def.mutates.size()) return def.mutates[o];
  if (o == 0 && def.view) return 0;
  return -1;  // (a to_global that changes nothing would share too; boxing insertion removed them)
}

// The op's own scratch on `rank` while it runs (OpDef::workspace_bytes).
int64_t WorkspaceBytes(const ir::Graph& graph, const ir::Op& op, int rank) {
  const OpDef& def = GetOpDef(op.name);
  if (!def.workspace_bytes) return 0;
  std::vector<TensorSpec> shards;
  for (int id : op.inputs) {
    const ir::Value& v = graph.value(id);
    if (v.is_global() && !v.placement.Contains(rank)) return 0;  // the rank takes no part
    shards.push_back(
        {v.is_global() ? LocalBox(v.shape, v.placement, v.nd_sbp, rank).shape() : v.shape, v.dtype});
  }
  const int64_t bytes = def.workspace_bytes(shards);
  return bytes <= 0 ? 0
                    : static_cast<int64_t>(CachingAllocator::RoundToSizeClass(static_cast<size_t>(bytes)));
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

std::vector<char> OpsTakingPart(const ir::Graph& graph, int rank) {
  std::vector<char> member(graph.ops().size(), 0);
  for (const ir::Op& op : graph.ops()) {
    const bool layout_change = op.kind == ir::OpKind::kToGlobal;
    bool takes_part = false;
    for (int id : op.outputs) {
      const ir::Value& v = graph.value(id);
      takes_part |= !v.is_global() || v.placement.Contains(rank);
    }
    for (int id : op.inputs) {
      const ir::Value& v = graph.value(id);
      // A layout change involves its source's ranks too (they send), and a
      // send only them.
      takes_part |= (layout_change || op.outputs.empty()) && v.is_global() && v.placement.Contains(rank);
    }
    member[static_cast<size_t>(op.id)] = takes_part;
  }
  return member;
}

int64_t ShardBytes(const ir::Value& value, int rank, int element_bytes) {
  if (value.is_global() && !value.placement.Contains(rank)) return 0;
  const int64_t elements = value.is_global()
                               ? LocalBox(value.shape, value.placement, value.nd_sbp, rank).numel()
                               : value.shape.numel();
  const int64_t bytes =
      elements * (element_bytes > 0 ? element_bytes : static_cast<int64_t>(ElementSize(value.dtype)));
  return bytes == 0 ? 0
                    : static_cast<int64_t>(CachingAllocator::RoundToSizeClass(static_cast<size_t>(bytes)));
}

MemoryPlan PlanMemory(const ir::Graph& graph, int rank, const MemoryPlanOptions& options) {
  EnsureLayoutOps();  // the graph's to_global and from_local ops are looked up
  // The ops the rank takes part in, for the default order and for slots
  // numbered for this rank alone.
  std::vector<char> taking_part;
  if (options.order.empty() || options.runs == nullptr) taking_part = OpsTakingPart(graph, rank);
  std::optional<StepRuns> own_runs;
  if (options.runs == nullptr) own_runs.emplace(graph, &taking_part);
  const StepRuns& runs = options.runs != nullptr ? *options.runs : *own_runs;
  MemoryPlan plan;
  plan.rank = rank;
  const std::vector<ir::Op>& ops = graph.ops();
  const size_t num_ops = ops.size(), slots = static_cast<size_t>(runs.slots());
  plan.live_bytes.assign(num_ops, 0);
  for (const ir::Value& v : graph.values()) {
    if (v.kind == ir::Value::Kind::kVariable) plan.variable_bytes += ShardBytes(v, rank);
    if (v.kind == ir::Value::Kind::kInput) plan.input_bytes += ShardBytes(v, rank);
  }
  // The runs in the order they are made; positions stand in for time below.
  std::vector<OpRun> program_order;
  if (options.order.empty()) program_order = runs.ProgramOrder(&taking_part);
  const std::vector<OpRun>& order = options.order.empty() ? program_order : options.order;
  const size_t n = order.size();
  const int end_of_order = static_cast<int>(n);
  std::vector<int> reads;            // the slots a run reads
  std::vector<int> last(slots, -1);  // per slot: the position of its last reader
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k].op)];
    runs.InputSlots(op, order[k].micro_batch, &reads);
    for (int s : reads)
      last[static_cast<size_t>(s)] = std::max(last[static_cast<size_t>(s)], static_cast<int>(k));
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const size_t s = static_cast<size_t>(runs.OutputSlot(op, o, order[k].micro_batch));
      last[s] = std::max(last[s], static_cast<int>(k));
    }
  }
  for (const auto& [name, id] : graph.outputs()) last[static_cast<size_t>(runs.Slot(id, -1))] = end_of_order;
  // Each op result's block: its own, or the one it shares (through chains
  // of views; a running sum's first is its share); a block lives until the
  // last reader of any slot on it.
  std::vector<int> block(slots);
  for (size_t i = 0; i < slots; ++i) block[i] = static_cast<int>(i);
  std::vector<int> block_end(last);
  std::vector<std::vector<int>> source_inputs(num_ops);  // per op and output (StorageSource), once
  std::vector<char> sourced(num_ops, 0);
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k].op)];
    std::vector<int>& sources = source_inputs[static_cast<size_t>(op.id)];
    if (!sourced[static_cast<size_t>(op.id)]) {
      sourced[static_cast<size_t>(op.id)] = 1;
      for (size_t o = 0; o < op.outputs.size(); ++o) sources.push_back(StorageSource(op, o));
    }
    bool shares = false;
    for (int input : sources) shares |= input >= 0;
    const bool first_sum = runs.sum(op.id) && order[k].micro_batch == 0;
    if (!shares && !first_sum) continue;
    runs.InputSlots(op, order[k].micro_batch, &reads);
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      // (A running sum's first is its share.)
      const int source = first_sum ? reads[0] : sources[o] < 0 ? -1 : reads[static_cast<size_t>(sources[o])];
      if (source < 0) continue;
      const int b = block[static_cast<size_t>(source)];
      const size_t out = static_cast<size_t>(runs.OutputSlot(op, o, order[k].micro_batch));
      block[out] = b;
      block_end[static_cast<size_t>(b)] = std::max(block_end[static_cast<size_t>(b)], last[out]);
    }
  }
  // Activations: what the forward computes and what backward recomputes of
  // it; not gradients, nor what the optimizer computes after backward. In
  // program order, results of ops before the last backward op that are not
  // backward ops themselves: with units, the units' forward ops and the
  // step's ops that run before the units.
  int last_backward = -1;
  for (const ir::Op& op : ops)
    if (op.backward) last_backward = op.id;
  const bool has_units = runs.micro_batches() > 1;
  auto is_activation = [&](const OpRun& r) {
    const ir::Op& op = ops[static_cast<size_t>(r.op)];
    if (op.backward) return op.recompute_region >= 0;
    return has_units ? runs.unit(op.id) || !runs.after_units(op.id) : op.id < last_backward;
  };
  // (Per value and per op, not per run: every micro-batch's are the same.)
  std::vector<int64_t> value_bytes(graph.values().size(), -1), workspace(num_ops, -1);
  auto bytes_of = [&](const ir::Op& op, int id) {
    int64_t& bytes = value_bytes[static_cast<size_t>(id)];
    if (bytes < 0) {
      const ir::Value& v = graph.value(id);
      const bool computed = options.compute_element_bytes > 0 && op.micro_batch >= 0 && IsFloating(v.dtype);
      bytes = ShardBytes(v, rank, computed ? options.compute_element_bytes : 0);
    }
    return bytes;
  };
  // Bytes allocated at and freed after each position: all results, and
  // activations alone. Results that outlive the last run are freed after it.
  std::vector<int64_t> born(n), freed(n), activations_born(n), activations_freed(n);
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k].op)];
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const int slot = runs.OutputSlot(op, o, order[k].micro_batch);
      if (block[static_cast<size_t>(slot)] != slot) continue;  // shares another's block
      const int64_t bytes = bytes_of(op, op.outputs[o]);
      const size_t end = std::min(static_cast<size_t>(block_end[static_cast<size_t>(slot)]), n - 1);
      born[k] += bytes;
      freed[end] += bytes;
      if (is_activation(order[k])) {
        activations_born[k] += bytes;
        activations_freed[end] += bytes;
      }
      plan.total_bytes += bytes;
    }
  }
  int64_t live = 0, live_activations = 0;
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k].op)];
    live += born[k];
    live_activations += activations_born[k];
    int64_t& scratch = workspace[static_cast<size_t>(op.id)];
    if (scratch < 0) scratch = WorkspaceBytes(graph, op, rank);
    const int64_t here = live + scratch;
    int64_t& most = plan.live_bytes[static_cast<size_t>(op.id)];
    most = std::max(most, here);
    if (here > plan.peak_bytes) plan.peak_bytes = here, plan.peak_op = op.id;
    plan.peak_activation_bytes = std::max(plan.peak_activation_bytes, live_activations);
    live -= freed[k];
    live_activations -= activations_freed[k];
  }
  if (plan.peak_op >= 0) plan.peak_op_name = ops[static_cast<size_t>(plan.peak_op)].name;
  return plan;
}

std::string MemoryPlanText(const MemoryPlan& plan) {
  std::string text = "peak " + FormatBytes(plan.peak_bytes) + " of op results";
  if (plan.peak_op >= 0) text += " (at op " + std::to_string(plan.peak_op) + " '" + plan.peak_op_name + "')";
  return text.append(", activations at most ")
      .append(FormatBytes(plan.peak_activation_bytes))
      .append(", ")
      .append(FormatBytes(plan.total_bytes))
      .append(" without reuse; variables ")
      .append(FormatBytes(plan.variable_bytes))
      .append(", inputs ")
      .append(FormatBytes(plan.input_bytes));
}

}  // namespace tessel::passes
