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
  return RunInOrder(plan::ExecPlan::Lower(graph, CurrentRank()), inputs, stats);
}

std::map<std::string, Tensor> RunInOrder(const plan::ExecPlan& plan,
                                         const std::map<std::string, Tensor>& inputs, RunStats* stats) {
  const ir::Graph& graph = plan.graph();
  TESSEL_CHECK_CODE(plan.instructions_run() == static_cast<int64_t>(graph.ops().size()),
                    StatusCode::kInternal)
      << "graph '" << graph.name() << "': the in-order executor runs every op; the plan was lowered for "
      << plan.instructions_run() << " of " << graph.ops().size();
  const passes::StepRuns& runs = plan.runs();
  // A slot per value, and per micro-batch of a unit's values.
  std::vector<Tensor> env = BindGraphValues(graph, inputs);
  env.resize(static_cast<size_t>(runs.slots()));
  // Each op result is dropped after its last reader (right away if nothing
  // reads it), as memory planning assumes; named results are kept.
  const std::vector<int>& free_after = plan.free_after();
  const size_t num_values = graph.values().size();
  auto drop_if_done = [&](int slot, int position) {
    if (free_after[static_cast<size_t>(slot)] == position &&
        (static_cast<size_t>(slot) >= num_values || graph.value(slot).kind == ir::Value::Kind::kOpOutput))
      env[static_cast<size_t>(slot)] = Tensor();
  };
  Allocator* allocator = GetAllocator(Device::CPU());
  const int64_t held_before = allocator->stats().allocated_bytes;
  if (stats != nullptr) allocator->ResetPeak();
  std::vector<Tensor> args;
  std::vector<int> in, out;
  const std::vector<passes::OpRun>& order = plan.program_order();
  for (size_t position = 0; position < order.size(); ++position) {
    const passes::OpRun& r = order[position];
    const plan::Instruction& ins = plan.at(r.op);
    const ir::Op& op = graph.ops()[static_cast<size_t>(r.op)];
    runs.InputSlots(op, r.micro_batch, &in);
    out.clear();
    for (size_t o = 0; o < op.outputs.size(); ++o) out.push_back(runs.OutputSlot(op, o, r.micro_batch));
    args.clear();
    for (int s : in) args.push_back(env[static_cast<size_t>(s)]);
    std::vector<Tensor> outs = plan.Run(ins, args, r.micro_batch);
    for (size_t o = 0; o < outs.size(); ++o) env[static_cast<size_t>(out[o])] = std::move(outs[o]);
    for (int s : in) drop_if_done(s, static_cast<int>(position));
    for (int s : out) drop_if_done(s, static_cast<int>(position));
  }
  args.clear();
  if (stats != nullptr) stats->peak_bytes = allocator->stats().peak_allocated_bytes - held_before;
  std::map<std::string, Tensor> results;
  for (const auto& [name, id] : graph.outputs())
    results[name] = plan.Global(id, env[static_cast<size_t>(runs.Slot(id, -1))]);
  return results;
}

}  // namespace tessel
