// Memory planning: which op results are alive at once on one rank, and so
// how much memory a step needs there.
//
// The rule it plans for is the executors': a result is freed right after
// the last op that reads it (a result nothing reads, right after its
// producer), and a freed block goes back to the allocator's cache for the
// next result of its size class to reuse. Views share their base's block
// (OpDef::view, from_local, a to_global that changes nothing) and keep it
// alive as long as they are; in-place updates write into their variables.
// Sizes are each value's shard on the rank, rounded up to the caching
// allocator's size class, since that is what the executor takes from it.
//
// The plan does not see blocks a kernel allocates for itself and frees
// before it returns (scratch buffers, communication buffers); the measured
// peak includes them (RunInOrder's RunStats).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"

namespace tessel::passes {

// For every value id, the last op that reads it: the op after which it can
// be freed. Named results live to the end (ops().size()); an op result that
// nothing reads dies with its producer; inputs and variables nothing reads,
// and values no op produces, get -1.
std::vector<int> LastReaders(const ir::Graph& graph);

// Bytes `rank` holds of `value`: its shard (a partial value's shard is
// whole; a local value is whole on every rank) rounded up to the
// allocator's size class; 0 if the rank lies outside its placement.
int64_t ShardBytes(const ir::Value& value, int rank);

struct MemoryPlan {
  int rank = 0;
  // Held across steps: variables (parameters, optimizer state).
  int64_t variable_bytes = 0;
  // Bound by the caller for the call: the graph inputs.
  int64_t input_bytes = 0;
  // The most bytes of op results alive at once: while op `peak_op` runs,
  // the results it reads, those later ops still need, and its own.
  int64_t peak_bytes = 0;
  int peak_op = -1;
  std::string peak_op_name;
  // Every op result's bytes added up, as if none were ever freed: what
  // freeing at the last reader saves.
  int64_t total_bytes = 0;
  // By op id: bytes of op results alive while the op runs.
  std::vector<int64_t> live_bytes;
};

// Plans `rank`'s memory for `graph` as compiled (boxing explicit). The rank
// need not lie in this process's world.
MemoryPlan PlanMemory(const ir::Graph& graph, int rank);

// "512 B", "1.5 KiB", "2.25 MiB".
std::string FormatBytes(int64_t bytes);

// "peak 1.2 MiB of op results (at op 57 'matmul'), 3.4 MiB without reuse;
// variables 5.6 MiB, inputs 2 KiB"
std::string MemoryPlanText(const MemoryPlan& plan);

}  // namespace tessel::passes
