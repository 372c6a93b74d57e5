#include "graph/passes/memory_planning.h"

#include <algorithm>
#include <cstdio>

#include "core/allocator.h"
#include "graph/global_tensor_ops.h"
#include "graph/passes/passes.h"
#include "sbp/global_tensor.h"

namespace tessel::passes {
namespace {

// The value output `o` of `op` shares its storage with (a view, an in-place
// update); -1 if it has its own.
int StorageSource(const ir::Op& op, size_t o) {
  const OpDef& def = GetOpDef(op.name);
  if (o < def.mutates.size()) return op.inputs[static_cast<size_t>(def.mutates[o])];
  if (o == 0 && def.view) return op.inputs[0];
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

std::vector<int> LastReaders(const ir::Graph& graph) {
  std::vector<int> last(graph.values().size(), -1);
  for (const ir::Op& op : graph.ops()) {
    for (int id : op.outputs) last[static_cast<size_t>(id)] = op.id;
    for (int id : op.inputs) last[static_cast<size_t>(id)] = op.id;
  }
  for (const auto& [name, id] : graph.outputs())
    last[static_cast<size_t>(id)] = static_cast<int>(graph.ops().size());
  return last;
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
  if (graph.micro_batch_units() > 1) {
    // The rank runs its copies of the units; an order would be of those.
    TESSEL_CHECK_CODE(options.order.empty(), StatusCode::kInternal)
        << "graph '" << graph.name() << "' holds micro-batch units: plan the memory of the graph the order "
        << "is of (the rank's, runtime::RankSchedule::graph)";
    return PlanMemory(UnrolledForRank(graph, rank), rank, options);
  }
  EnsureLayoutOps();  // the graph's to_global and from_local ops are looked up
  MemoryPlan plan;
  plan.rank = rank;
  const std::vector<ir::Op>& ops = graph.ops();
  const size_t num_ops = ops.size();
  plan.live_bytes.assign(num_ops, 0);
  for (const ir::Value& v : graph.values()) {
    if (v.kind == ir::Value::Kind::kVariable) plan.variable_bytes += ShardBytes(v, rank);
    if (v.kind == ir::Value::Kind::kInput) plan.input_bytes += ShardBytes(v, rank);
  }
  // The ops in the order they run, and each one's position in it (-1: not
  // run here). Positions stand in for time below.
  std::vector<int> order = options.order;
  if (order.empty()) {
    order.resize(num_ops);
    for (size_t k = 0; k < num_ops; ++k) order[k] = static_cast<int>(k);
  }
  const int end_of_order = static_cast<int>(order.size());
  std::vector<int> position(num_ops, -1);
  for (size_t k = 0; k < order.size(); ++k) position[static_cast<size_t>(order[k])] = static_cast<int>(k);
  // For every value, the position of its last reader (named results live
  // to the end; a result nothing reads dies with its producer).
  std::vector<int> last(graph.values().size(), -1);
  for (int id : order) {
    const ir::Op& op = ops[static_cast<size_t>(id)];
    for (int v : op.outputs)
      last[static_cast<size_t>(v)] = std::max(last[static_cast<size_t>(v)], position[id]);
    for (int v : op.inputs)
      last[static_cast<size_t>(v)] = std::max(last[static_cast<size_t>(v)], position[id]);
  }
  for (const auto& [name, id] : graph.outputs()) last[static_cast<size_t>(id)] = end_of_order;
  // Each op result's block: its own, or the one it shares (through chains
  // of views); a block lives until the last reader of any value on it.
  std::vector<int> block(graph.values().size());
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<int>(i);
  std::vector<int> block_end(last);
  for (int id : order) {
    const ir::Op& op = ops[static_cast<size_t>(id)];
    for (size_t o = 0; o < op.outputs.size(); ++o) {
      const int source = StorageSource(op, o);
      if (source < 0) continue;
      const int b = block[static_cast<size_t>(source)];
      block[static_cast<size_t>(op.outputs[o])] = b;
      block_end[static_cast<size_t>(b)] =
          std::max(block_end[static_cast<size_t>(b)], last[static_cast<size_t>(op.outputs[o])]);
    }
  }
  // Activations: what the forward computes (ops before the last backward
  // op that are not backward ops) and what backward recomputes of it; not
  // gradients, nor what the optimizer computes after backward.
  int last_backward = -1;
  for (const ir::Op& op : ops)
    if (op.backward) last_backward = op.id;
  auto is_activation = [&](const ir::Op& op) {
    return op.backward ? op.recompute_region >= 0 : op.id < last_backward;
  };
  auto bytes_of = [&](const ir::Op& op, const ir::Value& v) {
    const bool computed = options.compute_element_bytes > 0 && op.micro_batch >= 0 && IsFloating(v.dtype);
    return ShardBytes(v, rank, computed ? options.compute_element_bytes : 0);
  };
  // Bytes allocated at and freed after each position: all results, and
  // activations alone. Results that outlive the last op are freed after it.
  const size_t n = order.size();
  std::vector<int64_t> born(n), freed(n), activations_born(n), activations_freed(n);
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k])];
    for (int id : op.outputs) {
      if (block[static_cast<size_t>(id)] != id) continue;  // shares another's block
      const int64_t bytes = bytes_of(op, graph.value(id));
      const size_t end = std::min(static_cast<size_t>(block_end[static_cast<size_t>(id)]), n - 1);
      born[k] += bytes;
      freed[end] += bytes;
      if (is_activation(op)) {
        activations_born[k] += bytes;
        activations_freed[end] += bytes;
      }
      plan.total_bytes += bytes;
    }
  }
  int64_t live = 0, live_activations = 0;
  for (size_t k = 0; k < n; ++k) {
    const ir::Op& op = ops[static_cast<size_t>(order[k])];
    live += born[k];
    live_activations += activations_born[k];
    plan.live_bytes[static_cast<size_t>(op.id)] = live + WorkspaceBytes(graph, op, rank);
    if (plan.live_bytes[static_cast<size_t>(op.id)] > plan.peak_bytes)
      plan.peak_bytes = plan.live_bytes[static_cast<size_t>(op.id)], plan.peak_op = op.id;
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
