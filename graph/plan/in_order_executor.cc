#include "graph/plan/in_order_executor.h"

#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/passes.h"
#include "sbp/global_tensor.h"

namespace tessel {

std::vector<Tensor> BindGraphValues(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs) {
  std::vector<Tensor> env(graph.values().size());
  size_t bound = 0;
  for (const ir::Value& v : graph.values()) {
    if (v.kind == ir::Value::Kind::kVariable) {
      env[v.id] = graph.variable(v.id);
      TESSEL_CHECK(!env[v.id].is_lazy())
          << "graph '" << graph.name() << "': variable '" << v.name << "' (" << v.SpecString()
          << ") has no data: the graph was built for planning (graph/ir/meta.h) and can be compiled, not run";
    } else if (v.kind == ir::Value::Kind::kInput) {
      auto it = inputs.find(v.name);
      TESSEL_CHECK(it != inputs.end()) << "graph '" << graph.name() << "': input '" << v.name << "' ("
                                       << v.SpecString() << ") was not given";
      const Tensor& t = it->second;
      TESSEL_CHECK(t.defined() && !t.is_lazy())
          << "graph '" << graph.name() << "': input '" << v.name << "' needs data, got " << t.ToString();
      const ir::Value got = ir::Value::SpecOf(t);
      TESSEL_CHECK(got.SameSpec(v)) << "graph '" << graph.name() << "': input '" << v.name << "' is "
                                    << got.SpecString() << "; the graph was traced with " << v.SpecString();
      env[v.id] = t.detach();
      ++bound;
    }
  }
  if (bound != inputs.size()) {
    for (const auto& [name, t] : inputs) graph.InputId(name);  // throws naming the unknown input
  }
  return env;
}

std::map<std::string, Tensor> RunInOrder(const ir::Graph& graph, const std::map<std::string, Tensor>& inputs,
                                         RunStats* stats) {
  if (graph.micro_batch_units() > 1) {
    ir::Graph unrolled = graph;
    passes::UnrollMicroBatches(unrolled);
    return RunInOrder(plan::ExecPlan::Lower(unrolled, CurrentRank()), inputs, stats);
  }
  return RunInOrder(plan::ExecPlan::Lower(graph, CurrentRank()), inputs, stats);
}

std::map<std::string, Tensor> RunInOrder(const plan::ExecPlan& plan,
                                         const std::map<std::string, Tensor>& inputs, RunStats* stats) {
  const ir::Graph& graph = plan.graph();
  TESSEL_CHECK_CODE(plan.instructions_run() == static_cast<int64_t>(graph.ops().size()),
                    StatusCode::kInternal)
      << "graph '" << graph.name() << "': the in-order executor runs every op; the plan was lowered for "
      << plan.instructions_run() << " of " << graph.ops().size();
  std::vector<Tensor> env = BindGraphValues(graph, inputs);
  // Each op result is dropped after its last reader (right away if nothing
  // reads it), as memory planning assumes; named results are kept.
  const std::vector<int>& last_use = plan.free_after();
  auto drop_if_done = [&](int id, int op_id) {
    if (last_use[static_cast<size_t>(id)] == op_id && graph.value(id).kind == ir::Value::Kind::kOpOutput)
      env[static_cast<size_t>(id)] = Tensor();
  };
  Allocator* allocator = GetAllocator(Device::CPU());
  const int64_t held_before = allocator->stats().allocated_bytes;
  if (stats != nullptr) allocator->ResetPeak();
  std::vector<Tensor> args;
  for (const plan::Instruction& ins : plan.instructions()) {
    args.clear();
    for (int i : ins.inputs) args.push_back(env[static_cast<size_t>(i)]);
    std::vector<Tensor> outs = plan.Run(ins, args);
    for (size_t o = 0; o < outs.size(); ++o) env[static_cast<size_t>(ins.outputs[o])] = std::move(outs[o]);
    for (int i : ins.inputs) drop_if_done(i, ins.op);
    for (int o : ins.outputs) drop_if_done(o, ins.op);
  }
  args.clear();
  if (stats != nullptr) stats->peak_bytes = allocator->stats().peak_allocated_bytes - held_before;
  std::map<std::string, Tensor> results;
  for (const auto& [name, id] : graph.outputs()) results[name] = plan.Global(id, env[id]);
  return results;
}

}  // namespace tessel
