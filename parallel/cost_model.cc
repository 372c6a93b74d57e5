#include "parallel/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/plan/graph.h"
#include "ops/functional.h"
#include "runtime/actor_runtime.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The share of a global value one rank holds.
double LocalFraction(const ir::Value& v) {
  double f = 1;
  for (int a = 0; a < v.nd_sbp.size(); ++a)
    if (v.nd_sbp[a].is_split()) f /= static_cast<double>(v.placement.hierarchy()[static_cast<size_t>(a)]);
  return f;
}
double LocalBytes(const ir::Value& v) {
  const double bytes = static_cast<double>(v.shape.numel()) * static_cast<double>(ElementSize(v.dtype));
  return v.is_global() ? bytes * LocalFraction(v) : bytes;
}
// How many ranks share an op's work: the mesh axes its result is split or
// partial over.
double Parallelism(const ir::Value& out) {
  double n = 1;
  for (int a = 0; a < out.nd_sbp.size(); ++a)
    if (!out.nd_sbp[a].is_broadcast())
      n *= static_cast<double>(out.placement.hierarchy()[static_cast<size_t>(a)]);
  return n;
}
// An op's time alone on one rank: a matmul's multiply-adds at the matmul
// rate, any other op the elements it writes at the elementwise rate.
double OpSeconds(const ir::Graph& g, const ir::Op& op, const CostModel& m) {
  const OpWork work = WorkOf(g, op);
  return 2 * work.multiply_adds / m.flops_per_s + work.elements / m.elements_per_s;
}

struct StageCost {
  double compute_s = 0, comm_s = 0, activation_bytes = 0, parameter_bytes = 0;
  int64_t ops = 0, collectives = 0;
};

// The time of moving `v` into layout `to` on its placement, axis by axis.
// It recurs once per micro-batch (the bytes are the batch's in all).
void AddLayoutChange(const ir::Value& v, const NdSbp& to, double micro, const CostModel& m, StageCost* s) {
  const double local = LocalBytes(v);
  for (int a = 0; a < v.nd_sbp.size() && a < to.size(); ++a) {
    const Sbp& from = v.nd_sbp[a];
    const Sbp& into = to[a];
    if (from == into || (from.is_broadcast() && !into.is_broadcast()))
      continue;  // free: a slice, or a share of a sum
    const double n = static_cast<double>(v.placement.hierarchy()[static_cast<size_t>(a)]);
    double bytes = 0;
    if (from.is_partial())
      bytes = (into.is_broadcast() ? 2 : 1) * (n - 1) / n * local;  // all-reduce / reduce-scatter
    else if (into.is_broadcast())
      bytes = (n - 1) * local;  // all-gather
    else
      bytes = (n - 1) / n * local;  // all-to-all
    s->comm_s += micro * m.latency_s + bytes / m.bytes_per_s;
    s->collectives += static_cast<int64_t>(micro);
  }
}

}  // namespace

std::vector<double> MeanOverRanks(const std::vector<double>& mine) {
  const int world = CurrentWorldSize();
  if (world == 1) return mine;
  const Placement everyone = WorldPlacement(DeviceType::kCPU);
  const std::vector<float> values(mine.begin(), mine.end());
  const int64_t n = static_cast<int64_t>(values.size());
  NoGradGuard no_grad;
  const std::vector<float> sum =
      FromLocal(Tensor::FromVector<float>(values, {n}), everyone, {P()}, Shape({n}))
          .to_global(everyone, {B()})
          .to_local()
          .ToVector<float>();
  std::vector<double> mean(sum.begin(), sum.end());
  for (double& x : mean) x /= world;
  return mean;
}

CostModel CostModel::Measure() {
  CostModel m;
  NoGradGuard no_grad;
  if (CurrentWorldSize() > 1) {
    const Placement everyone = WorldPlacement(DeviceType::kCPU);
    auto time_all_reduce = [&](int64_t elements, int reps) {
      const Tensor p = zeros({elements}, everyone, {P()});
      p.to_global(everyone, {B()});
      const auto t = Clock::now();
      for (int i = 0; i < reps; ++i) p.to_global(everyone, {B()});
      return Since(t) / reps;
    };
    m.latency_s = time_all_reduce(2, 5);
    const double big = time_all_reduce(256 * 1024, 3);
    const double bytes = 2.0 * (CurrentWorldSize() - 1) / CurrentWorldSize() * 1024 * 1024;
    m.bytes_per_s = bytes / std::max(big - m.latency_s, big * 0.1);
  }
  {
    const Tensor a = randn({384, 384}, 1), b = randn({384, 384}, 2);
    fn::matmul(a, b);
    const auto t = Clock::now();
    for (int i = 0; i < 6; ++i) fn::matmul(a, b);
    m.flops_per_s = 6 * 2.0 * 384 * 384 * 384 / std::max(Since(t), 1e-9);
  }
  {
    // A layer norm: between a cheap add and an erf-bound gelu, as the
    // model's other ops are.
    const Tensor x = randn({4096, 256}, 3), gamma = ones({256}), beta = zeros({256});
    fn::layer_norm(x, gamma, beta);
    const auto t = Clock::now();
    for (int i = 0; i < 5; ++i) fn::layer_norm(x, gamma, beta);
    m.elements_per_s = 5.0 * 4096 * 256 / std::max(Since(t), 1e-9);
  }
  {
    // An op's cost beyond its arithmetic as graph mode runs it: a chain of
    // tiny ops compiled and run by the actor runtime.
    constexpr int kOps = 64;
    runtime::ActorRuntime actors;
    Graph chain("cost_model_probe",
                [](const Graph::Tensors& in) -> Graph::Tensors {
                  Tensor y = in.at("x");
                  for (int i = 0; i < kOps; ++i) y = fn::add_scalar(y, 1.0);
                  return {{"y", y}};
                },
                {.executor = actors.Executor()});
    const Graph::Tensors in = {{"x", zeros({8})}};
    chain(in);
    const auto t = Clock::now();
    for (int i = 0; i < 5; ++i) chain(in);
    m.op_overhead_s = Since(t) / (5 * kOps);
  }
  // Every rank must plan alike: the rates averaged over the ranks.
  const std::vector<double> mean =
      MeanOverRanks({m.flops_per_s / 1e9, m.elements_per_s / 1e9, m.op_overhead_s * 1e6, m.latency_s * 1e3,
                     m.bytes_per_s / 1e9});
  m.flops_per_s = mean[0] * 1e9;
  m.elements_per_s = mean[1] * 1e9;
  m.op_overhead_s = mean[2] * 1e-6;
  m.latency_s = mean[3] * 1e-3;
  m.bytes_per_s = mean[4] * 1e9;
  return m;
}

std::string CostModel::ToText() const {
  char text[200];
  std::snprintf(
      text, sizeof(text),
      "%.2f GFLOP/s in matmuls, %.0f M elements/s elementwise, %.1f us per op, %.2f ms per collective, "
      "%.2f GB/s",
      flops_per_s / 1e9, elements_per_s / 1e6, op_overhead_s * 1e6, latency_s * 1e3, bytes_per_s / 1e9);
  return text;
}

std::string PlanEstimate::ToText() const {
  char text[240];
  std::snprintf(
      text, sizeof(text),
      "%.1f ms (compute %.1f, communication %.1f in %lld collectives, overhead %.1f; bubble %.0f%%), "
      "%.1f MiB per rank",
      step_s * 1e3, compute_s * 1e3, communication_s * 1e3, static_cast<long long>(collectives),
      overhead_s * 1e3, bubble * 100, static_cast<double>(memory_bytes) / (1 << 20));
  return text;
}

PlanEstimate EstimatePlan(const PolicyContext& context, const ParallelPlan& plan, const CostModel& m) {
  const std::unique_ptr<ir::Graph> g = context.trace(plan);
  const double replicas = static_cast<double>(context.config.runtime_ranks) / context.config.plan_ranks;
  const double micro = plan.micro_batches, p = static_cast<double>(plan.stages);
  const int64_t per_stage = plan.data_parallel * plan.tensor_parallel;
  std::vector<StageCost> stages(static_cast<size_t>(plan.stages));
  auto stage_of = [&](const ir::Value& v) {
    return std::min<int64_t>(plan.stages - 1, v.placement.ranks().at(0) / per_stage);
  };
  for (const ir::Value& v : g->values())
    if (v.kind == ir::Value::Kind::kVariable && v.is_global() && context.parameters.count(v.name))
      stages[static_cast<size_t>(stage_of(v))].parameter_bytes += LocalBytes(v);
  for (const ir::Op& op : g->ops()) {
    if (op.outputs.empty()) continue;
    const ir::Value& out = g->value(op.outputs[0]);
    if (!out.is_global()) continue;  // constants the model builds: every rank, once
    StageCost& s = stages[static_cast<size_t>(stage_of(out))];
    ++s.ops;
    s.activation_bytes += LocalBytes(out);
    if (op.name == "to_global" || op.name == "from_local") {
      const ir::Value& in = g->value(op.inputs.at(0));
      if (!in.is_global()) continue;
      if (in.placement != out.placement) {
        // A stage transfer, once per micro-batch. The actor runtime posts
        // it on its communication thread while compute goes on, so only
        // its bytes count, not its latency.
        s.comm_s += LocalBytes(in) / m.bytes_per_s;
        s.collectives += static_cast<int64_t>(micro);
      } else {
        AddLayoutChange(in, out.nd_sbp, micro, m, &s);
      }
      continue;
    }
    s.compute_s += OpSeconds(*g, op, m) / Parallelism(out);
    for (size_t i = 0; i < op.inputs.size() && i < op.input_sbp.size(); ++i) {
      const ir::Value& in = g->value(op.inputs[i]);
      if (in.is_global() && in.nd_sbp != op.input_sbp[i]) AddLayoutChange(in, op.input_sbp[i], micro, m, &s);
    }
  }
  PlanEstimate e;
  e.bubble = (p - 1) / (micro + p - 1);
  const double dp = static_cast<double>(plan.data_parallel) * replicas;
  double busiest = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageCost& s = stages[i];
    // Backward: twice the forward's arithmetic, the same communication
    // again; every op runs once per micro-batch each way.
    const double compute = 3 * s.compute_s / replicas;
    const double comm = 2 * s.comm_s;
    const double overhead = 3 * static_cast<double>(s.ops) * micro * m.op_overhead_s;
    // Data-parallel gradient all-reduce (bucketed) and AdamW over the
    // stage's parameters.
    const double sync = dp > 1 ? m.latency_s * std::ceil(s.parameter_bytes / (25.0 * (1 << 20))) +
                                     2 * (dp - 1) / dp * s.parameter_bytes / m.bytes_per_s
                               : 0;
    const double optimizer = 4 * s.parameter_bytes / 4 / m.elements_per_s;  // AdamW: a few passes over them
    const double total = (compute + comm + overhead) / (1 - e.bubble) + sync + optimizer;
    // Memory: parameter, gradient and the two moments, and the
    // activations of the micro-batches in flight (1F1B: p - s of them).
    const double in_flight = std::min(p - static_cast<double>(i), micro) / micro;
    const int64_t memory =
        static_cast<int64_t>(4 * s.parameter_bytes + s.activation_bytes / replicas * in_flight);
    e.memory_bytes = std::max(e.memory_bytes, memory);
    if (total > busiest) {
      busiest = total;
      e.step_s = total;
      e.compute_s = compute;
      e.communication_s = comm + sync;
      e.overhead_s = overhead;
      e.collectives = 2 * s.collectives;
    }
  }
  return e;
}

}  // namespace tessel::parallel
