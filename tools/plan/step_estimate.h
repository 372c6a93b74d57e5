// How long a planned step takes: a cost model of the machine (GEMM
// throughput by call size, memory bandwidth, the runtime's cost per op,
// collective and point-to-point latency and bandwidth), each stage's ops
// timed by it in the order the runtime runs them, and the pipeline
// schedule played over the stages with those times.
//
// The machine's constants are measured here (CalibrateMachine, every rank
// of a launch at once, so ranks sharing cores share them as in a run) or
// stated by the user for the machine the job will run on; the estimate
// says which. What the model leaves out: communication overlapping
// computation (a collective's time is added to its stream's stage), kernel
// efficiency beyond a matmul's size, and contention between stages other
// than what the measurement saw.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "graph/plan/rank_plan.pb.h"
#include "runtime/rank_schedule.h"

namespace tessel::plan {

struct MachineModel {
  // f32 matmul throughput by the FLOPs of one call: (flops, flop/s) points,
  // ascending; between them log-linear, beyond them the nearest.
  std::vector<std::pair<double, double>> gemm;
  double memory_bytes_per_s = 0;      // elementwise ops: bytes read and written
  double op_overhead_s = 0;           // the runtime's own cost for each op it runs
  double collective_latency_s = 0;    // a collective's fixed cost
  double collective_bytes_per_s = 0;  // a rank's link in a ring collective
  double p2p_latency_s = 0;           // a stage transfer's fixed cost
  double p2p_bytes_per_s = 0;
  std::string source;  // "measured by 4 processes on this machine", "given"

  double GemmSeconds(double flops) const;
  // One line per constant, for the plan's assumptions.
  std::string Text() const;
};

// Measures the constants on this machine: every rank of the world calls
// it at once (a collective); each runs its own microbenchmarks meanwhile,
// so processes sharing cores measure them shared. Rank 0's figures (the
// collectives' are common) are returned on every rank.
MachineModel CalibrateMachine();

// What one stage's ops cost under `machine`, by unit.
struct StageTimes {
  int stage = 0;
  std::vector<runtime::Action> actions;  // the stage's units in schedule order
  // By (chunk, micro-batch, pass: 0 forward, 1 backward, 2 weight
  // gradient): the unit's seconds.
  std::map<std::tuple<int, int, int>, double> unit_s;
  double before_s = 0;  // ops before every unit (hoisted layout changes)
  double after_s = 0;   // ops after every unit (gradient reductions, clipping, the optimizer)
  double compute_s = 0, communication_s = 0;  // of every op, summed
  double gemm_flops = 0;
};
StageTimes TimeStage(const ir::Graph& graph, const runtime::RankSchedule& ranked,
                     const proto::RankPlanProto& comms, const MachineModel& machine);

struct StepEstimate {
  double step_s = 0;
  // The stage whose step ends last, its own busy time, and what of the
  // step it waits (the bubble, transfers waited for).
  int critical_stage = 0;
  double busy_s = 0;
  double compute_s = 0, communication_s = 0;  // of the critical stage
};
// Plays the stages' orders: virtual stage j's forward of micro-batch k
// after j - 1's, its backward after j + 1's (the last one's after its own
// forward), a weight-gradient unit after its backward; each stage runs its
// units one at a time in its order.
StepEstimate PlayPipeline(const std::vector<StageTimes>& stages, int micro_batches, int chunks);

}  // namespace tessel::plan
