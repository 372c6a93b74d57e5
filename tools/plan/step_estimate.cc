#include "tools/plan/step_estimate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

#include "core/comm/process_group.h"
#include "core/error.h"
#include "graph/plan/graph.h"
#include "ops/functional.h"
#include "runtime/actor_runtime.h"
#include "sbp/global_tensor.h"

namespace tessel::plan {
namespace {

// The median seconds of one call of `f` over exactly `reps` calls after
// one to warm up: for what takes part in collectives, which every rank
// must call alike. The median, because processes sharing cores see some
// calls wait for a peer to be scheduled.
double SecondsPerCallOf(const std::function<void()>& f, int reps) {
  f();
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + reps / 2, seconds.end());
  return seconds[static_cast<size_t>(reps / 2)];
}

// Mean seconds of one call of `f` over at least `reps` calls and 0.2 s
// (local work only: the call count differs between ranks).
double SecondsPerCall(const std::function<void()>& f, int reps) {
  f();  // warm: first-touch allocation, caches
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (calls < reps || elapsed < 0.2) {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return elapsed / calls;
}

int64_t ElementsOn(const ir::Value& v, int rank) {
  if (!v.is_global()) return v.shape.numel();
  if (!v.placement.Contains(rank)) return 0;
  return LocalBox(v.shape, v.placement, v.nd_sbp, rank).numel();
}

// 2 x rows x k x n of the products an op computes on `rank`; 0 for the
// ops that are not matrix products.
double GemmFlops(const ir::Graph& graph, const ir::Op& op, int rank) {
  auto shard = [&](int id) {
    const ir::Value& v = graph.value(id);
    return v.is_global() ? LocalBox(v.shape, v.placement, v.nd_sbp, rank).shape() : v.shape;
  };
  auto last = [](const Shape& s) { return s.ndim() == 0 ? int64_t{1} : s[s.ndim() - 1]; };
  if (op.name == "linear" || op.name == "linear_gelu_tanh" || op.name == "linear_residual" ||
      op.name == "linear_weight_grad") {
    // x [..., k] with W [k, n] (or dy [..., n]).
    const Shape x = shard(op.inputs[0]), other = shard(op.inputs[1]);
    const int64_t k = last(x);
    return k == 0 ? 0 : 2.0 * static_cast<double>(x.numel() / k) * static_cast<double>(k) * last(other);
  }
  if (op.name == "matmul") {
    const Shape a = shard(op.inputs[0]), out = shard(op.outputs[0]);
    const bool transpose_a = op.attrs.Get<bool>("transpose_a");
    const int64_t k = a.ndim() < 2 ? last(a) : transpose_a ? a[a.ndim() - 2] : last(a);
    return 2.0 * static_cast<double>(out.numel()) * static_cast<double>(k);
  }
  return 0;
}

}  // namespace

double MachineModel::GemmSeconds(double flops) const {
  if (flops <= 0 || gemm.empty()) return 0;
  if (flops <= gemm.front().first) return flops / gemm.front().second;
  if (flops >= gemm.back().first) return flops / gemm.back().second;
  for (size_t i = 1; i < gemm.size(); ++i) {
    if (flops > gemm[i].first) continue;
    const double t = std::log(flops / gemm[i - 1].first) / std::log(gemm[i].first / gemm[i - 1].first);
    const double rate = std::exp(std::log(gemm[i - 1].second) * (1 - t) + std::log(gemm[i].second) * t);
    return flops / rate;
  }
  return flops / gemm.back().second;
}

std::string MachineModel::Text() const {
  char line[512];
  std::string text = "machine (" + source + "):\n  f32 matmul:";
  for (const auto& [flops, rate] : gemm) {
    std::snprintf(line, sizeof line, " %.3g GFLOP/s at %.3g MFLOP,", rate / 1e9, flops / 1e6);
    text += line;
  }
  text.pop_back();
  std::snprintf(
      line, sizeof line,
      "\n  elementwise %.2f GB/s; %.1f us per op of the runtime; collectives %.1f us + bytes at %.2f "
      "GB/s a link (ring); stage transfers %.1f us + bytes at %.2f GB/s\n",
      memory_bytes_per_s / 1e9, op_overhead_s * 1e6, collective_latency_s * 1e6, collective_bytes_per_s / 1e9,
      p2p_latency_s * 1e6, p2p_bytes_per_s / 1e9);
  return text + line;
}

MachineModel CalibrateMachine() {
  comm::Communicator& world = comm::World();
  const int n = world.size(), rank = world.rank();
  MachineModel m;
  m.source =
      "measured on this machine by " + std::to_string(n) + " process" + (n == 1 ? "" : "es") + " at once";
  // Matrix products of growing size, every rank at once.
  for (int64_t size : {32, 64, 128, 256, 512}) {
    const Tensor a = randn({size, size}, 1), b = randn({size, size}, 2);
    world.Barrier();
    const double seconds = SecondsPerCall([&] { fn::matmul(a, b); }, 5);
    const double flops = 2.0 * static_cast<double>(size * size * size);
    m.gemm.emplace_back(flops, flops / seconds);
  }
  {
    const Tensor x = randn({1 << 20}, 3), y = randn({1 << 20}, 4);
    world.Barrier();
    m.memory_bytes_per_s = 3.0 * 4 * (1 << 20) / SecondsPerCall([&] { fn::add(x, y); }, 5);
  }
  {
    // The runtime's cost per op: a compiled chain of tiny ops on the actor
    // runtime (their arithmetic is nothing).
    constexpr int kOps = 200;
    runtime::ActorRuntime actors({.schedule = "1f1b"});
    Graph chain("calibrate_op_overhead",
                [](const Graph::Tensors& in) {
                  Tensor x = in.at("x");
                  for (int i = 0; i < kOps; ++i) x = fn::add_scalar(x, 1.0);
                  return Graph::Tensors{{"y", x}};
                },
                {.executor = actors.Executor()});
    const Graph::Tensors inputs{{"x", full({16}, 0.0)}};
    world.Barrier();
    m.op_overhead_s = SecondsPerCallOf([&] { chain(inputs); }, 10) / kOps;
  }
  if (n > 1) {
    std::vector<float> buffer(1 << 18);  // 1 MiB
    // All-reduces in pairs of ranks (0 with 1, ...; a tensor-parallel
    // group of 2), all pairs at once: a small one's time is the latency, a
    // large one's the rest.
    const int first = rank - rank % 2;
    const std::shared_ptr<comm::Communicator> pair =
        first + 1 < n ? comm::GetGroup({first, first + 1}) : comm::GetGroup({rank});
    world.Barrier();
    comm::Communicator& group = pair ? *pair : world;
    const int group_size = group.size();
    m.collective_latency_s = SecondsPerCallOf(
        [&] { group.AllReduce(buffer.data(), 2, DType::kFloat32, comm::ReduceOp::kSum); }, 100);
    const double large = SecondsPerCallOf(
        [&] {
          group.AllReduce(buffer.data(), static_cast<int64_t>(buffer.size()), DType::kFloat32,
                          comm::ReduceOp::kSum);
        },
        20);
    const double bytes = group_size > 1 ? 2.0 * (group_size - 1) / group_size *
                                              static_cast<double>(buffer.size() * sizeof(float))
                                        : 0;
    m.collective_bytes_per_s = bytes / std::max(large - m.collective_latency_s, 1e-9);
    // Stage transfers: ranks in pairs (0 with 1, ...) bounce a message; a
    // one-way trip is half the round.
    const int peer = rank ^ 1;
    auto bounce = [&](int64_t count) {
      if (peer >= n) return;
      if (rank % 2 == 0) {
        world.Send(buffer.data(), count, DType::kFloat32, peer);
        world.Recv(buffer.data(), count, DType::kFloat32, peer);
      } else {
        world.Recv(buffer.data(), count, DType::kFloat32, peer);
        world.Send(buffer.data(), count, DType::kFloat32, peer);
      }
    };
    world.Barrier();
    // A fixed number of rounds, so the peers' loops end together.
    auto one_way = [&](int64_t count, int rounds) {
      return SecondsPerCallOf([&] { bounce(count); }, rounds) / 2;
    };
    m.p2p_latency_s = one_way(2, 200);
    const double p2p_large = one_way(static_cast<int64_t>(buffer.size()), 20);
    m.p2p_bytes_per_s =
        static_cast<double>(buffer.size() * sizeof(float)) / std::max(p2p_large - m.p2p_latency_s, 1e-9);
  }
  // Rank 0's figures on every rank: one machine model.
  std::vector<double> numbers;
  for (const auto& [flops, rate] : m.gemm) numbers.push_back(rate);
  for (double v : {m.memory_bytes_per_s, m.op_overhead_s, m.collective_latency_s, m.collective_bytes_per_s,
                   m.p2p_latency_s, m.p2p_bytes_per_s})
    numbers.push_back(v);
  // (as 8-byte words: a broadcast copies bits)
  world.Broadcast(numbers.data(), static_cast<int64_t>(numbers.size()), DType::kInt64, 0);
  size_t i = 0;
  for (auto& point : m.gemm) point.second = numbers[i++];
  for (double* v : {&m.memory_bytes_per_s, &m.op_overhead_s, &m.collective_latency_s,
                    &m.collective_bytes_per_s, &m.p2p_latency_s, &m.p2p_bytes_per_s})
    *v = numbers[i++];
  return m;
}

StageTimes TimeStage(const ir::Graph& graph, const runtime::RankSchedule& ranked,
                     const proto::RankPlanProto& comms, const MachineModel& machine) {
  const int rank = comms.rank();
  StageTimes out;
  out.stage = ranked.stage;
  out.actions = ranked.actions;
  std::map<int, const proto::PlanOpProto*> comms_of;
  for (const proto::PlanOpProto& op : comms.ops())
    if (op.comms_size() > 0) comms_of[op.op()] = &op;
  // An op's time is the same in every run: timed once, added per run.
  struct OpTime {
    double compute = 0, communication = 0, gemm_flops = 0;
  };
  std::map<int, OpTime> time_of;
  auto time_op = [&](const ir::Op& op) -> OpTime {
    double compute = machine.op_overhead_s, communication = 0;
    const auto found = comms_of.find(op.id);
    if (found != comms_of.end()) {
      for (const proto::CommProto& c : found->second->comms()) {
        const double bytes = static_cast<double>(c.bytes()), ranks = std::max(c.ranks_size(), 1);
        if (c.kind() == "send" || c.kind() == "recv") {
          communication +=
              machine.p2p_latency_s + (machine.p2p_bytes_per_s > 0 ? bytes / machine.p2p_bytes_per_s : 0);
        } else {
          // Ring collectives: an all-reduce moves 2 (n - 1) / n of the
          // buffer over each rank's link, a gather or scatter half that.
          const double share = (c.kind() == "all-reduce" ? 2.0 : 1.0) * (ranks - 1) / ranks;
          communication +=
              machine.collective_latency_s +
              (machine.collective_bytes_per_s > 0 ? share * bytes / machine.collective_bytes_per_s : 0);
        }
      }
      return {compute, communication, 0};
    }
    const double flops = GemmFlops(graph, op, rank);
    if (flops > 0) return {compute + machine.GemmSeconds(flops), communication, flops};
    double bytes = 0;
    for (int v : op.inputs)
      bytes += ElementsOn(graph.value(v), rank) * static_cast<double>(ElementSize(graph.value(v).dtype));
    for (int v : op.outputs)
      bytes += ElementsOn(graph.value(v), rank) * static_cast<double>(ElementSize(graph.value(v).dtype));
    compute += machine.memory_bytes_per_s > 0 ? bytes / machine.memory_bytes_per_s : 0;
    return {compute, communication, 0};
  };
  const passes::StepRuns& runs = ranked.exec.runs();
  // Ops of the step before the units: with units, those the in-order
  // executor runs first; without, those ahead of the first micro-batch op.
  int first_unit_op = std::numeric_limits<int>::max();
  for (const passes::OpRun& run : ranked.order)
    if (run.micro_batch >= 0) first_unit_op = std::min(first_unit_op, run.op);
  auto before_units = [&](int op) {
    return runs.micro_batches() > 1 ? !runs.after_units(op) : op < first_unit_op;
  };
  for (const passes::OpRun& run : ranked.order) {
    const ir::Op& op = graph.ops()[static_cast<size_t>(run.op)];
    auto [it, is_new] = time_of.try_emplace(op.id);
    if (is_new) it->second = time_op(op);
    const auto [compute, communication, flops] = it->second;
    out.gemm_flops += flops;
    out.compute_s += compute;
    out.communication_s += communication;
    const double seconds = compute + communication;
    if (run.micro_batch >= 0) {
      const int pass = ranked.weight[static_cast<size_t>(op.id)] ? 2 : op.backward ? 1 : 0;
      out.unit_s[{ranked.ChunkOf(op.stage), run.micro_batch, pass}] += seconds;
    } else if (before_units(op.id)) {
      out.before_s += seconds;
    } else {
      out.after_s += seconds;
    }
  }
  return out;
}

StepEstimate PlayPipeline(const std::vector<StageTimes>& stages, int micro_batches, int chunks) {
  const int p = static_cast<int>(stages.size());
  const int virtual_stages = p * chunks;
  constexpr double kNotYet = -1;
  std::vector<std::vector<double>> forward_end(virtual_stages, std::vector<double>(micro_batches, kNotYet)),
      backward_end = forward_end;
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p), busy(p);
  for (int s = 0; s < p; ++s) free_at[s] = busy[s] = stages[s].before_s;
  auto unit_seconds = [&](int s, const runtime::Action& a) {
    const auto it = stages[s].unit_s.find({a.chunk, a.micro_batch, a.weight ? 2 : a.backward ? 1 : 0});
    return it == stages[s].unit_s.end() ? 0.0 : it->second;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < stages[s].actions.size()) {
        const runtime::Action& a = stages[s].actions[next[s]];
        const int j = a.chunk * p + s, k = a.micro_batch;
        double ready = 0;
        if (!a.backward) {
          ready = j == 0 ? 0 : forward_end[j - 1][k];
        } else if (a.weight) {
          ready = backward_end[j][k];
        } else {
          ready = j == virtual_stages - 1 ? forward_end[j][k] : backward_end[j + 1][k];
        }
        if (ready == kNotYet) break;
        const double seconds = unit_seconds(s, a);
        const double end = std::max(free_at[s], ready) + seconds;
        free_at[s] = end;
        busy[s] += seconds;
        if (!a.backward) forward_end[j][k] = end;
        if (a.backward && !a.weight) backward_end[j][k] = end;
        ++next[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < p; ++s)
    TESSEL_CHECK_CODE(next[s] == stages[s].actions.size(), StatusCode::kInternal)
        << "step estimate: stage " << s << " waits forever at unit " << next[s] << " of its schedule";
  StepEstimate e;
  for (int s = 0; s < p; ++s) {
    const double end = free_at[s] + stages[s].after_s;
    if (end > e.step_s) {
      e.step_s = end;
      e.critical_stage = s;
      e.busy_s = busy[s] + stages[s].after_s;
      e.compute_s = stages[s].compute_s;
      e.communication_s = stages[s].communication_s;
    }
  }
  return e;
}

}  // namespace tessel::plan
