// Memory planning: which op results are alive at once on one rank, and so
// how much memory a step needs there.
//
// The rule it plans for is the executors': a result is freed right after
// the last op that reads it (a result nothing reads, right after its
// producer), and a freed block goes back to the allocator's cache for the
// next result of its size class to reuse. Views share their base's block
// (OpDef::view: reshape, from_local) and keep it alive as long as they are; in-place updates write into their variables.
// Sizes are each value's shard on the rank, rounded up to the caching
// allocator's size class, since that is what the executor takes from it.
//
// Blocks a kernel allocates for itself and frees before it returns count
// while the op runs when its OpDef declares them (workspace_bytes: the
// packed buffer of a gradient bucket); undeclared scratch is not seen by
// the plan, but is by the measured peak (RunInOrder's RunStats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "graph/passes/step_runs.h"

namespace tessel::passes {

// Bytes `rank` holds of `value`: its shard (a partial value's shard is
// whole; a local value is whole on every rank) rounded up to the
// allocator's size class; 0 if the rank lies outside its placement.
// element_bytes > 0 takes the place of the dtype's size.
int64_t ShardBytes(const ir::Value& value, int rank, int element_bytes = 0);

// Per op id: whether `rank` takes part in the op — its placement holds the
// rank (local ops: every rank), or it is a layout change whose source
// placement holds it (the rank sends), or a send from its placement.
std::vector<char> OpsTakingPart(const ir::Graph& graph, int rank);

struct MemoryPlan {
  int rank = 0;
  // Held across steps: variables (parameters, optimizer state).
  int64_t variable_bytes = 0;
  // Bound by the caller for the call: the graph inputs.
  int64_t input_bytes = 0;
  // The most bytes of op results alive at once: while op `peak_op` runs,
  // the results it reads, those later ops still need, its own and its
  // declared workspace.
  int64_t peak_bytes = 0;
  int peak_op = -1;
  std::string peak_op_name;
  // The most bytes of activations alive at once: results of forward ops
  // (those before the last backward op that are not backward ops
  // themselves) and of ops backward recomputes (activation
  // checkpointing); gradients and the optimizer's results are not.
  int64_t peak_activation_bytes = 0;
  // Every op result's bytes added up, as if none were ever freed: what
  // freeing at the last reader saves.
  int64_t total_bytes = 0;
  // By op id: bytes of op results (and its workspace) alive while the op
  // runs (a unit: the most over its runs).
  std::vector<int64_t> live_bytes;
};

struct MemoryPlanOptions {
  // The runs of the ops the rank runs (a unit's once per micro-batch,
  // graph/passes/step_runs.h), in the order it makes them (a pipeline
  // schedule's: runtime/rank_schedule.h); a result is freed after its last
  // reader among them, and results of ops not listed are not the rank's.
  // Empty: the runs of the ops the rank takes part in (OpsTakingPart), in
  // program order (StepRuns::ProgramOrder, the in-order executor's).
  std::vector<OpRun> order = {};
  // The graph's runs and slots, when the caller has them (a RankSchedule's
  // exec.runs()); null: made here.
  const StepRuns* runs = nullptr;
  // When > 0, the bytes of an element of every floating-point result of a
  // micro-batch's forward or backward, in place of its dtype's: a graph
  // traced in f32 planned as mixed precision computes it (2: bf16 or f16).
  // Variables and what runs once a step (the optimizer) keep their dtype.
  int compute_element_bytes = 0;
};

// Plans `rank`'s memory for `graph` as compiled (boxing explicit). The rank
// need not lie in this process's world.
MemoryPlan PlanMemory(const ir::Graph& graph, int rank, const MemoryPlanOptions& options = {});

// "512 B", "1.5 KiB", "2.25 MiB", "80.00 GiB".
std::string FormatBytes(int64_t bytes);

// "peak 1.20 MiB of op results (at op 57 'matmul'), activations at most
// 800.0 KiB, 3.40 MiB without reuse; variables 5.60 MiB, inputs 2.0 KiB"
std::string MemoryPlanText(const MemoryPlan& plan);

}  // namespace tessel::passes
