// The policy registry and the built-in policies: dp, tp, pp, hybrid.
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "parallel/plan.h"

namespace tessel::parallel {

namespace {

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Policy>& Registry();

// Micro-batches for `stages` stages when the config leaves them to the
// policy: twice the stages (a pipeline is idle (p-1)/(m+p-1) of a step), or
// the stages, when the batch's rows per data-parallel rank allow; 1 without
// a pipeline.
int ChooseMicroBatches(const PolicyContext& c, int64_t stages, int64_t data_parallel) {
  if (c.config.micro_batches > 0) return c.config.micro_batches;
  if (stages <= 1) return 1;
  int64_t rows = 0;
  for (const ir::Value& v : c.graph.values())
    if (v.kind == ir::Value::Kind::kInput && v.shape.ndim() >= 1)
      rows = rows ? std::min(rows, v.shape[0]) : v.shape[0];
  const int64_t replicas = c.config.runtime_ranks / c.config.plan_ranks;
  const int64_t per_rank = rows / std::max<int64_t>(1, data_parallel * replicas);
  for (int64_t m : {2 * stages, stages})
    if (per_rank > 0 && per_rank % m == 0) return static_cast<int>(m);
  return static_cast<int>(stages);  // parallelize names the rows that do not divide
}

// dp x tp x pp over the plan's ranks: policy sizes in, a plan out.
ParallelPlan Compose(const PolicyContext& c, const std::string& name, int64_t dp, int64_t tp, int64_t pp) {
  TESSEL_CHECK(dp >= 1 && tp >= 1 && pp >= 1 && dp * tp * pp == c.config.plan_ranks)
      << "policy '" << name << "': data " << dp << " x tensor " << tp << " x pipeline " << pp << " = "
      << dp * tp * pp << " ranks; plan_ranks is " << c.config.plan_ranks;
  ParallelPlan plan;
  plan.policy = name;
  plan.data_parallel = dp;
  plan.tensor_parallel = tp;
  plan.stages = pp;
  plan.op_stage = SplitStages(c.graph, c.parameters, pp, &plan.reasons);
  plan.micro_batches = ChooseMicroBatches(c, pp, dp);
  if (tp > 1) plan.parameter_split = ChooseTensorSplits(c, plan, &plan.reasons);
  return plan;
}

std::map<std::string, Policy>& Registry() {
  static std::map<std::string, Policy> registry = {
      {"dp", [](const PolicyContext& c) { return Compose(c, "dp", c.config.plan_ranks, 1, 1); }},
      {"tp", [](const PolicyContext& c) { return Compose(c, "tp", 1, c.config.plan_ranks, 1); }},
      {"pp", [](const PolicyContext& c) { return Compose(c, "pp", 1, 1, c.config.plan_ranks); }},
      {"hybrid",
       [](const PolicyContext& c) {
         // The config's sizes; unset ones: tensor 2, then pipeline 2, then
         // data the rest (each only where the ranks left divide).
         const int64_t n = c.config.plan_ranks;
         int64_t tp = c.config.tensor_parallel_size, pp = c.config.pipeline_parallel_size,
                 dp = c.config.data_parallel_size;
         auto left = [&] { return n / std::max<int64_t>(1, (tp ? tp : 1) * (pp ? pp : 1) * (dp ? dp : 1)); };
         if (!tp) tp = left() % 2 == 0 ? 2 : 1;
         if (!pp) pp = left() % 2 == 0 ? 2 : 1;
         if (!dp) dp = left();
         return Compose(c, "hybrid", dp, tp, pp);
       }},
  };
  return registry;
}

}  // namespace

void RegisterPolicy(const std::string& name, Policy policy) {
  TESSEL_CHECK(!name.empty() && policy != nullptr) << "RegisterPolicy needs a name and a function";
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[name] = std::move(policy);
}

const Policy& GetPolicy(const std::string& name) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::string names;
    for (const auto& [n, p] : Registry()) names += (names.empty() ? "" : ", ") + n;
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "unknown parallelization policy '" << name << "'; registered: " << names;
  }
  return it->second;
}

std::vector<std::string> PolicyNames() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<std::string> names;
  for (const auto& [n, p] : Registry()) names.push_back(n);
  return names;
}

std::map<std::string, int> FirstUseStages(const ir::Graph& g, const std::vector<int>& op_stage) {
  std::map<std::string, int> stages;
  for (const ir::Op& op : g.ops())
    for (int v : op.inputs) {
      const ir::Value& value = g.value(v);
      if (value.kind != ir::Value::Kind::kOpOutput && static_cast<size_t>(op.id) < op_stage.size())
        stages.emplace(value.name, op_stage[static_cast<size_t>(op.id)]);
    }
  return stages;
}

std::string ParallelPlan::ToText() const {
  std::ostringstream out;
  out << "policy '" << policy << "': " << stages << " stage" << (stages > 1 ? "s" : "") << " of [data "
      << data_parallel << " x tensor " << tensor_parallel << "] ranks, " << micro_batches << " micro-batch"
      << (micro_batches > 1 ? "es" : "") << " per step\n";
  for (const auto& [name, sbp] : parameter_split)
    if (!sbp.is_broadcast()) out << "  " << name << ": " << NdSbp({sbp}).ToString() << " over tensor\n";
  for (const std::string& r : reasons) out << "  " << r << "\n";
  return out.str();
}

}  // namespace tessel::parallel
