// The graph compiler's passes, one per file (graph/passes/<name>.cc). Each
// rewrites a traced graph in place and leaves it well formed
// (ir::Verify); the pass manager (pass_manager.h) runs them in a fixed
// order. Exposed one by one for their tests.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "graph/ir/graph_ir.h"

namespace tessel::passes {

// Activation checkpointing: for each region of forward ops traced under a
// RecomputeScope (Op::recompute_region), the region's ops whose results
// backward reads are copied, as backward ops of that region, right before
// the first backward op that reads the region, and every backward read of
// the region's values takes the copy. What the forward computed inside the
// region then dies in the forward (dead code elimination removes what
// nothing reads any more); only the values that flow into the region stay
// alive until backward. Throws, naming the op, if a region updates a
// variable in place (recomputing it would update twice).
void RecomputeCheckpointedRegions(ir::Graph& graph);

// Drops ops whose results nothing reads: neither a later live op nor a
// graph result. Ops that update variables in place (OpDef::mutates) stay.
void EliminateDeadCode(ir::Graph& graph);

// Gradient accumulation as a rewrite of a step traced on one micro-batch
// (every graph input read through a `micro_batch` op of index 0 and count
// `micro_batches`, as Graph traces with GraphOptions::micro_batches) into
// micro-batch units: the ops that depend on the inputs — forward and
// backward — stay once, marked as standing for each micro-batch
// (Op::micro_batch 0, Graph::micro_batch_units() = micro_batches), so the
// passes after it work on one micro-batch's ops whatever the count. The
// variables' gradients (ir::Graph::gradients) and the scalar results
// computed from the batch are summed over the micro-batches
// (`micro_batch_sum` ops, right after the op computing each share) and
// scaled by 1/micro_batches; the ops that read them (clipping, the
// optimizer) run once, on the averages. Executors run each unit once per
// micro-batch (graph/passes/step_runs.h). Throws, naming the input, result or op, if an input
// is read other than through such a micro_batch op, a result computed from
// the batch is not a floating scalar, an op reads both a micro-batch's
// values and the averaged gradients, or moving the units ahead of the
// step's in-place updates would change what an op reads. micro_batches <= 1
// changes nothing.
void AccumulateGradients(ir::Graph& graph, int micro_batches);

// Makes every layout change an op: where a global op reads a value whose
// NdSbp differs from the layout its signature chose, a `to_global` op
// converting it is inserted before its first such reader — exactly one per
// (value, layout), shared by the readers that want that layout. Layout
// changes that change nothing (a to_global to the value's own layout, kept
// by the trace only for its gradient) are removed. Afterwards the executor
// boxes nothing implicitly (ir::Verify with explicit_boxing holds).
void InsertBoxing(ir::Graph& graph);

// Pipeline stages: `stage_ranks[s]` are stage s's world ranks (no rank in
// two stages) and `layer_stages[l]` the stage of model layer l. Every op
// gets the stage whose ranks hold the values it computes (Op::stage; -1
// for local ops, which run on every rank). A layout change between
// stages becomes a `send` on the source stage and a `recv` on the
// destination, with the layout changes each side needs before and after
// as to_global ops of their own (stage boundaries are then explicit for
// the executor and the plan); each send / recv pair carries its own
// message tag. Throws, naming the op, for an op of layer l computed off
// layer l's stage, an op whose values lie on several stages or off every
// stage, and a layer beyond `layer_stages`. Empty `stage_ranks`: nothing
// changes. Runs after boxing insertion.
//
// Virtual stages (interleaved pipelines): when `layer_stages` name more
// stages than `stage_ranks` holds, p = stage_ranks.size(), they are
// virtual stages 0..v p - 1 (v p of them, every one given a layer),
// virtual stage j running on stage_ranks[j mod p]. Op::stage is then the
// virtual stage: a layer's ops get their layer's; an op of no layer the
// latest virtual stage among the ops on its ranks whose results it reads
// (the first of its ranks' when there are none); a transfer's receiving
// side the next virtual stage on its ranks after the sender's (forward)
// or the one before it (backward).
void AssignStages(ir::Graph& graph, const std::vector<std::vector<int>>& stage_ranks,
                  const std::vector<int64_t>& layer_stages);
// The message tag of a send or recv op AssignStages made (its "tag"
// attribute on the stage-transfer channel); none for one without.
std::optional<uint32_t> StageTransferTag(const Attrs& attrs);

// Fuses data-parallel gradient reductions into buckets: `to_global` ops that
// turn a partial sum into a broadcast along one mesh axis (one all-reduce
// on each group along that axis) are grouped by (placement, mesh axis,
// dtype, micro-batch), in the order their inputs are produced, into
// `all_reduce_bucket` ops of at most `bucket_bytes` logical bytes each
// (a single larger tensor gets its own). A bucket never holds a reduction
// whose input depends on another member's result; independent reductions
// outside backward fuse as well (a loss and its token count). The ops are
// then reordered, stably, so each bucket runs right after its last member's
// input is produced and before any reader of its members, so it may
// overlap the rest of backward once ops run concurrently. bucket_bytes <= 0
// turns the pass off.
void BucketGradients(ir::Graph& graph, int64_t bucket_bytes);

}  // namespace tessel::passes
