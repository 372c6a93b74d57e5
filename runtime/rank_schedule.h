// The order in which one rank runs its part of a compiled graph under a
// pipeline schedule: which ops are the rank's, which stage (and model
// chunks) it holds, and the one sequence its actors are ranked in — the
// runs of the rank's ops (a micro-batch unit's once per micro-batch,
// graph/passes/step_runs.h) sorted by dependence and, among ready ones, by
// the schedule's slot of their unit (micro-batch, chunk, forward / backward
// / weight gradient) on this stage (runtime/pipeline_schedule.h). The actor runtime
// splits it into its streams; the memory plan of a schedule
// (graph/passes/memory_planning.h) walks it to see what a stage holds at
// once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "graph/plan/exec_plan.h"
#include "runtime/pipeline_schedule.h"

namespace tessel::runtime {

struct RankSchedule {
  // The rank's stage of `stages`, holding `chunks` model chunks (virtual
  // stages stage, stage + stages, ...; Op::stage is the virtual stage); -1
  // for a rank on no stage of a pipeline (it runs the local ops only).
  int stage = 0, stages = 1, chunks = 1, micro_batches = 1;
  // The model chunk of an op of `virtual_stage` (0 for local ops).
  int ChunkOf(int virtual_stage) const { return virtual_stage < 0 ? 0 : virtual_stage / stages; }
  std::vector<Action> actions;  // the stage's units in the schedule's order
  std::vector<char> runs;       // per op: the rank runs it
  // Per op: a backward op of the weight-gradient (W) part of its
  // micro-batch, when the schedule lists W units.
  std::vector<char> weight;
  bool split_backward = false;  // the schedule lists W units
  plan::ExecPlan exec;          // the rank's ops lowered to instructions
  std::vector<int> mine;        // op ids the rank runs, in program order
  // Per entry of `mine`: the entries it depends on (edges from ops of
  // other stages are kept by the transfers themselves).
  std::vector<std::vector<int>> preds;
  // The runs of the rank's ops, in the order they are ranked.
  std::vector<passes::OpRun> order;
  // The run of `before` (an op `op` depends on) that op's run for
  // `micro_batch` waits for: the same micro-batch's between units, a sum's
  // last (the whole sum) for an op of the step, the only run of an op of
  // the step. As a StepRuns::RunIndex.
  int PredRun(int before, int op, int micro_batch) const {
    const passes::StepRuns& r = exec.runs();
    return r.RunIndex(before, r.unit(op) ? micro_batch : r.micro_batches() - 1);
  }
};

// Throws on a schedule whose stages disagree or would wait on each other
// (CheckSchedule), naming the graph, or on a rank holding stages no
// interleaving explains, or on units that cannot run as such (StepRuns).
// `graph` must outlive the result.
RankSchedule ScheduleRank(const ir::Graph& graph, int rank, const std::string& schedule);

}  // namespace tessel::runtime
