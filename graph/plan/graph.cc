#include "graph/plan/graph.h"

#include <glog/logging.h>

#include <chrono>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/ir/tracer.h"
#include "graph/passes/pass_manager.h"
#include "graph/plan/in_order_executor.h"
#include "sbp/global_tensor.h"

namespace tessel {

Graph::Graph(std::string name, BuildFn build) : name_(std::move(name)), build_(std::move(build)) {
  TESSEL_CHECK(build_ != nullptr) << "graph '" << name_ << "' needs a build function";
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
    Tensors lazy;
    for (const auto& [name, t] : inputs) lazy[name] = tracer.Input(name, t);
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
  }
  const size_t traced_ops = graph->ops().size();
  passes::CompileGraph(*graph, passes::CompileOptions::FromFlags());
  LOG_IF(INFO, CurrentRank() == 0)
      << "graph '" << name_ << "': traced " << traced_ops << " ops and compiled them to " << graph->ops().size()
      << " in " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3
      << " ms";
  return *cache_.emplace(key.str(), std::move(graph)).first->second;
}

Graph::Tensors Graph::operator()(const Tensors& inputs) { return RunInOrder(Trace(inputs), inputs); }

}  // namespace tessel
