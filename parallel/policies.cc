// The policy registry and the built-in policies: dp, tp, pp, hybrid, auto.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "core/error.h"
#include "parallel/cost_model.h"
#include "parallel/plan.h"

namespace tessel::parallel {

namespace {

std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, Policy>& Registry();

// Rows of the batch each data-parallel rank gets.
int64_t RowsPerRank(const PolicyContext& c, int64_t data_parallel) {
  int64_t rows = 0;
  for (const ir::Value& v : c.graph.values())
    if (v.kind == ir::Value::Kind::kInput && v.shape.ndim() >= 1)
      rows = rows ? std::min(rows, v.shape[0]) : v.shape[0];
  const int64_t replicas = c.config.runtime_ranks / c.config.plan_ranks;
  return rows / std::max<int64_t>(1, data_parallel * replicas);
}

// Micro-batches for `stages` stages when the config leaves them to the
// policy: twice the stages (a pipeline is idle (p-1)/(m+p-1) of a step), or
// the stages, when the batch's rows per data-parallel rank allow; 1 without
// a pipeline.
int ChooseMicroBatches(const PolicyContext& c, int64_t stages, int64_t data_parallel) {
  if (c.config.micro_batches > 0) return c.config.micro_batches;
  if (stages <= 1) return 1;
  const int64_t per_rank = RowsPerRank(c, data_parallel);
  for (int64_t m : {2 * stages, stages})
    if (per_rank > 0 && per_rank % m == 0) return static_cast<int>(m);
  return static_cast<int>(stages);  // parallelize names the rows that do not divide
}

// "auto": every data x tensor x pipeline factorisation of the plan's ranks,
// and for pipelines p, 2p and 4p micro-batches where the rows allow,
// predicted by the cost model; the fastest within the memory limit wins.
ParallelPlan SearchPlan(const PolicyContext& c) {
  const CostModel model = CostModel::Measure();
  const int64_t n = c.config.plan_ranks, limit = c.config.memory_limit_bytes;
  struct Candidate {
    ParallelPlan plan;
    PlanEstimate estimate;
  };
  std::vector<Candidate> fits, all;
  for (int64_t tp = 1; tp <= n; ++tp) {
    if (n % tp) continue;
    for (int64_t pp = 1; pp <= n / tp; ++pp) {
      if ((n / tp) % pp) continue;
      const int64_t dp = n / tp / pp;
      std::vector<int> micro = {1};
      if (pp > 1) {
        micro.clear();
        for (int64_t m : {pp, 2 * pp, 4 * pp})
          if (RowsPerRank(c, dp) % m == 0) micro.push_back(static_cast<int>(m));
      }
      if (c.config.micro_batches > 0) micro = {c.config.micro_batches};
      for (int m : micro) {
        ParallelPlan plan;
        try {
          plan = ComposePlan(c, "auto", dp, tp, pp, m);
        } catch (const Error&) {
          continue;  // no such plan for this model (too few places to cut, say)
        }
        Candidate candidate{plan, EstimatePlan(c, plan, model)};
        all.push_back(candidate);
        if (limit <= 0 || candidate.estimate.memory_bytes <= limit) fits.push_back(candidate);
      }
    }
  }
  TESSEL_CHECK(!all.empty()) << "policy 'auto': no plan of " << n << " ranks could be made for this model";
  auto text = [](const Candidate& k) {
    return "data " + std::to_string(k.plan.data_parallel) + " x tensor " +
           std::to_string(k.plan.tensor_parallel) + " x pipeline " + std::to_string(k.plan.stages) + ", " +
           std::to_string(k.plan.micro_batches) + " micro-batch" + (k.plan.micro_batches > 1 ? "es" : "");
  };
  if (fits.empty()) {
    const Candidate& smallest =
        *std::min_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
          return a.estimate.memory_bytes < b.estimate.memory_bytes;
        });
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "policy 'auto': no plan meets the memory limit of " << limit
        << " bytes per rank; the smallest of the " << all.size() << " found needs "
        << smallest.estimate.memory_bytes << " bytes (" << text(smallest) << ")";
  }
  std::stable_sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
    return a.estimate.step_s < b.estimate.step_s;
  });
  // The prediction ranks the splits; a few steps of each micro-batch count
  // that fits of the three splits it ranks first decide: the model misses
  // costs that grow with the op count, such as each micro-batch's
  // scheduling, by up to a few times on a busy host, so it favours many
  // micro-batches (a smaller bubble) more than such a host does.
  size_t best = 0;
  std::vector<std::string> trials;
  double fastest = 0;
  // Times candidate i; keeps it if fastest so far.
  auto try_candidate = [&](size_t i) {
    double seconds = 0;
    try {
      seconds = c.measure(fits[i].plan);
    } catch (const Error& e) {  // refused the same way on every rank, before any step
      trials.push_back("auto: could not try " + text(fits[i]) + ": " + e.what());
      return;
    }
    char line[64];
    std::snprintf(line, sizeof(line), ": measured %.1f ms per step", seconds * 1e3);
    trials.push_back("auto: tried " + text(fits[i]) + line);
    if (fastest == 0 || seconds < fastest) {
      fastest = seconds;
      best = i;
    }
  };
  auto split_of = [](const ParallelPlan& p) {
    return std::vector<int64_t>{p.data_parallel, p.tensor_parallel, p.stages};
  };
  if (c.measure) {
    std::set<std::vector<int64_t>> splits;
    for (size_t i = 0; i < fits.size() && splits.size() < 3; ++i) splits.insert(split_of(fits[i].plan));
    for (size_t i = 0; i < fits.size(); ++i)
      if (splits.count(split_of(fits[i].plan))) try_candidate(i);
  }
  ParallelPlan chosen = fits[best].plan;
  std::vector<std::string> reasons = {
      "auto: rates " + model.ToText(),
      "auto: chose " + text(fits[best]) + ", predicted " + fits[best].estimate.ToText()};
  reasons.insert(reasons.end(), trials.begin(), trials.end());
  for (const Candidate& k : all) {
    const bool over = limit > 0 && k.estimate.memory_bytes > limit;
    reasons.push_back("auto:   " + text(k) + ": " + k.estimate.ToText() +
                      (over ? " (over the memory limit)" : ""));
  }
  reasons.insert(reasons.end(), chosen.reasons.begin(), chosen.reasons.end());
  chosen.reasons = reasons;
  return chosen;
}

std::map<std::string, Policy>& Registry() {
  static std::map<std::string, Policy> registry = {
      {"auto", SearchPlan},
      {"dp", [](const PolicyContext& c) { return ComposePlan(c, "dp", c.config.plan_ranks, 1, 1); }},
      {"tp", [](const PolicyContext& c) { return ComposePlan(c, "tp", 1, c.config.plan_ranks, 1); }},
      {"pp", [](const PolicyContext& c) { return ComposePlan(c, "pp", 1, 1, c.config.plan_ranks); }},
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
         return ComposePlan(c, "hybrid", dp, tp, pp);
       }},
  };
  return registry;
}

}  // namespace

ParallelPlan ComposePlan(const PolicyContext& c, const std::string& name, int64_t dp, int64_t tp, int64_t pp,
                         int micro_batches) {
  TESSEL_CHECK(dp >= 1 && tp >= 1 && pp >= 1 && dp * tp * pp == c.config.plan_ranks)
      << "policy '" << name << "': data " << dp << " x tensor " << tp << " x pipeline " << pp << " = "
      << dp * tp * pp << " ranks; plan_ranks is " << c.config.plan_ranks;
  ParallelPlan plan;
  plan.policy = name;
  plan.data_parallel = dp;
  plan.tensor_parallel = tp;
  plan.stages = pp;
  plan.op_stage = SplitStages(c.graph, c.parameters, pp, &plan.reasons);
  plan.micro_batches = micro_batches > 0 ? micro_batches : ChooseMicroBatches(c, pp, dp);
  if (tp > 1) plan.parameter_split = ChooseTensorSplits(c, plan, &plan.reasons);
  return plan;
}

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
