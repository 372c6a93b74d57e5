// The graph compiler's passes, one per file (graph/passes/<name>.cc). Each
// rewrites a traced graph in place and leaves it well formed
// (ir::Verify); the pass manager (pass_manager.h) runs them in a fixed
// order. Exposed one by one for their tests.
#pragma once

#include <cstdint>

#include "graph/ir/graph_ir.h"

namespace tessel::passes {

// Drops ops whose results nothing reads: neither a later live op nor a
// graph result. Ops that update variables in place (OpDef::mutates) stay.
void EliminateDeadCode(ir::Graph& graph);

// Makes every layout change an op: where a global op reads a value whose
// NdSbp differs from the layout its signature chose, a `to_global` op
// converting it is inserted before its first such reader — exactly one per
// (value, layout), shared by the readers that want that layout. Layout
// changes that change nothing (a to_global to the value's own layout, kept
// by the trace only for its gradient) are removed. Afterwards the executor
// boxes nothing implicitly (ir::Verify with explicit_boxing holds).
void InsertBoxing(ir::Graph& graph);

// Fuses data-parallel gradient reductions into buckets: `to_global` ops that
// turn a partial sum into a broadcast along one mesh axis (one all-reduce
// on each group along that axis) are grouped by (placement, mesh axis,
// dtype), in the order their inputs are produced, into
// `all_reduce_bucket` ops of at most `bucket_bytes` logical bytes each
// (a single larger tensor gets its own). A bucket runs one all-reduce of
// its members' shards packed together, right after its last member is
// produced, so it may overlap the rest of backward once ops run
// concurrently. bucket_bytes <= 0 turns the pass off.
void BucketGradients(ir::Graph& graph, int64_t bucket_bytes);

}  // namespace tessel::passes
