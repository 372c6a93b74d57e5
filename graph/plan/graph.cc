#include "graph/plan/graph.h"

#include <glog/logging.h>

#include <chrono>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/ir/tracer.h"
#include "graph/passes/memory_planning.h"
#include "graph/passes/pass_manager.h"
#include "graph/passes/passes.h"
#include "graph/plan/in_order_executor.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"

namespace tessel {

Graph::Graph(std::string name, BuildFn build, GraphOptions options)
    : name_(std::move(name)), build_(std::move(build)), options_(options) {
  TESSEL_CHECK(build_ != nullptr) << "graph '" << name_ << "' needs a build function";
  TESSEL_CHECK(options_.micro_batches >= 1)
      << "graph '" << name_ << "': micro_batches is " << options_.micro_batches << "; expected 1 or more";
}

Tensor Graph::MicroBatchOf(const std::string& name, const Tensor& input) const {
  const int n = options_.micro_batches;
  if (n == 1) return input;
  const ir::Value spec = ir::Value::SpecOf(input);
  TESSEL_CHECK(spec.shape.ndim() >= 1)
      << "graph '" << name_ << "': input '" << name << "' (" << spec.SpecString() << ") is a scalar; with "
      << n << " micro-batches every input is cut along dimension 0";
  // Each rank cuts its own rows: as many blocks as shards of dimension 0.
  int64_t shards = 1;
  for (int a = 0; a < spec.nd_sbp.size(); ++a)
    if (spec.nd_sbp[a].is_split(0)) shards *= spec.placement.hierarchy()[static_cast<size_t>(a)];
  TESSEL_CHECK(spec.shape[0] % (shards * n) == 0)
      << "graph '" << name_ << "': input '" << name << "' (" << spec.SpecString() << ") has " << spec.shape[0]
      << " rows in dimension 0"
      << (shards > 1 ? std::string(", split over ").append(std::to_string(shards)).append(" ranks") : "")
      << "; " << n << " micro-batches need a multiple of " << shards * n;
  return ApplyOp("micro_batch", {input},
                 {{"index", int64_t{0}}, {"count", int64_t{n}}, {"blocks", shards}})[0];
}

const ir::Graph& Graph::Trace(const Tensors& inputs) {
  std::ostringstream key;
  for (const auto& [name, t] : inputs) {
    TESSEL_CHECK(t.defined()) << "graph '" << name_ << "': input '" << name << "' is an undefined tensor";
    key << name << ": " << ir::Value::SpecOf(t).SpecString() << "\n";
  }
  auto it = cache_.find(key.str());
  if (it != cache_.end()) return *it->second;
  for (const auto& [name, t] : inputs) {
    auto [known, is_new] = input_dtypes_.try_emplace(name, t.dtype());
    TESSEL_CHECK(is_new || known->second == t.dtype())
        << "graph '" << name_ << "': input '" << name << "' is " << DTypeName(t.dtype())
        << " now; the graph was traced with " << DTypeName(known->second)
        << " for it. A graph input keeps its dtype across calls (a new shape traces another graph); "
           "convert the tensor or build another Graph";
  }

  if (!cache_.empty()) {
    // Not the first trace: say so, a recompile per step is a slow program.
    LOG_IF(INFO, CurrentRank() == 0) << "graph '" << name_
                                     << "': inputs of new specs, tracing and compiling again ("
                                     << cache_.size() + 1 << " graphs now):\n"
                                     << key.str();
  }
  const auto start = std::chrono::steady_clock::now();
  auto graph = std::make_unique<ir::Graph>(name_);
  {
    TracingInterpreter tracer(*graph);
    AutogradInterpreter autograd(tracer);
    InterpreterScope scope(autograd);
    // Each leaf's gradient as the last backward left it.
    std::map<const void*, Tensor> gradients;
    LeafGradientWatch watch([&](const void* leaf, const Tensor& grad) { gradients[leaf] = grad; });
    Tensors lazy;
    for (const auto& [name, t] : inputs) lazy[name] = MicroBatchOf(name, tracer.Input(name, t));
    Tensors results;
    try {
      results = build_(lazy);
    } catch (const std::out_of_range& e) {
      // What inputs.at(name) throws for a name the call did not give.
      std::string names;
      for (const auto& [name, t] : inputs) names += (names.empty() ? "'" : ", '") + name + "'";
      TESSEL_THROW(StatusCode::kInvalidArgument)
          << "graph '" << name_
          << "': the build function looked up a tensor the call did not give (inputs: " << names
          << "): " << e.what();
    }
    TESSEL_CHECK(!results.empty()) << "graph '" << name_ << "': the build function returned no results";
    for (const auto& [name, t] : results) {
      TESSEL_CHECK(t.defined()) << "graph '" << name_ << "': result '" << name << "' is an undefined tensor";
      graph->MarkOutput(name, tracer.ValueOf(t, "result '" + name + "'"));
    }
    for (const auto& [leaf, grad] : gradients)
      if (grad.is_lazy()) graph->MarkGradient(tracer.ValueOf(grad, "a gradient"));
  }
  const size_t traced_ops = graph->ops().size();
  passes::CompileOptions options = passes::CompileOptions::FromFlags();
  options.micro_batches = options_.micro_batches;
  options.stage_ranks = options_.stage_ranks;
  options.layer_stages = options_.layer_stages;
  passes::CompileGraph(*graph, options);
  LOG_IF(INFO, CurrentRank() == 0)
      << "graph '" << name_ << "': traced " << traced_ops << " ops and compiled them to "
      << graph->ops().size() << " in "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3
      << " ms; memory on rank 0: " << passes::MemoryPlanText(passes::PlanMemory(*graph, 0));
  return *cache_.emplace(key.str(), std::move(graph)).first->second;
}

Graph::Tensors Graph::operator()(const Tensors& inputs) {
  const ir::Graph& graph = Trace(inputs);
  if (options_.executor) return options_.executor(graph, inputs);
  auto found = plans_.find(&graph);
  if (found == plans_.end())
    found = plans_.emplace(&graph, plan::ExecPlan::Lower(graph, CurrentRank())).first;
  return RunInOrder(found->second, inputs);
}

}  // namespace tessel
