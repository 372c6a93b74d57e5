// The executable plan: a compiled graph lowered for one rank into
// instructions that a step runs as they are. Lowering does, once, what the
// eager interpreter does for every call: it resolves each op's kernel for
// its placement's device, this rank's box of every input and output, the
// layout every result is wrapped in, and each communication's boxing plan,
// stage-transfer peers and message tag. A step then binds tensors to value
// slots and runs instructions: no shape or SBP inference, no text parsing,
// no layout checks, no lookups by op name (the eager interpreter stays for
// tracing and eager mode).
//
// Kernel results stay bare shards between instructions (ExecPlan::Global
// wraps them where needed).
//
// A graph of micro-batch units is lowered once, not per micro-batch: a
// unit's instruction runs once per micro-batch k, its tensors in slot k of
// each value it reads and writes (graph/passes/step_runs.h), its transfers
// tagged for k, a `micro_batch` op taking micro-batch k and a
// `micro_batch_sum` adding share k to the sum so far.
//
// Both executors run these instructions: the in-order one
// (graph/plan/in_order_executor.h) and the actor runtime
// (runtime/actor_runtime.h).
//
//   const ExecPlan plan = ExecPlan::Lower(graph, CurrentRank());
//   for (const passes::OpRun& r : plan.runs().ProgramOrder())
//     outputs = plan.Run(plan.at(r.op), inputs_of(r), r.micro_batch);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "graph/passes/step_runs.h"
#include "sbp/boxing_plan.h"
#include "sbp/global_tensor.h"

namespace tessel {

struct PostedSends;
struct PostedReceive;

namespace plan {

// A global value's layout as a step wraps a shard in it (checked when the
// value was traced), shared by every tensor the plan makes of the value.
struct ValueLayout {
  std::shared_ptr<const GlobalMeta> meta;  // null: a local value
  Shape logical;
  Shape shard;          // this rank's box's shape
  bool member = false;  // this rank is in the placement (its shard lives on the placement's device)
};

struct Instruction {
  enum class Kind : uint8_t {
    kKernel,     // the op's kernel on this rank's shards (or on whole local tensors)
    kNotHere,    // a global op whose placement leaves this rank out: empty shards of its results
    kBoxing,     // to_global: a boxing plan resolved when lowering
    kSend,       // a pipeline stage's send (graph/passes: stage_assignment)
    kRecv,       // its receive on the next stage
    kFromLocal,  // a local tensor made global in its output's layout (its logical shape known)
    kSelfRun,    // an op that runs itself (OpDef::run): all_reduce_bucket
    kSum,        // micro_batch_sum: share k added to the sum so far (the `add` kernel)
  };
  Kind kind = Kind::kKernel;
  int op = 0;  // its id in the graph
  // Whether this rank runs it (an executor may lower only the ops of its
  // rank's pipeline stage).
  bool runs = false;
  const OpDef* def = nullptr;
  const Attrs* attrs = nullptr;  // the graph's op's (the plan lives with the graph)
  const Kernel* kernel = nullptr;
  bool global = false;
  // A micro-batch unit's: runs once per micro-batch.
  bool unit = false;
  std::vector<int> inputs, outputs;  // value ids
  std::vector<TensorSpec> logical_inputs, logical_outputs;
  std::vector<Box> input_boxes, output_boxes;  // this rank's (global ops)
  // Inputs whose layout is not the one the op runs with (a graph traced
  // but not compiled leaves such conversions implicit): boxed first by
  // these plans; null where the input is used as it is.
  std::vector<std::shared_ptr<const BoxingPlan>> input_boxing;
  std::vector<ValueLayout> output_layouts;
  // A unit's `micro_batch` op: its attributes for each micro-batch (the
  // index set).
  std::vector<Attrs> micro_batch_attrs;
  // kBoxing: the conversion (null when the layouts are equal).
  std::shared_ptr<const BoxingPlan> boxing;
  // kSend: the destination's layout; kRecv: the source's and the
  // destination's. The message tag pairs the two sides (a unit's, for
  // micro-batch 0: StepRuns::Tag gives micro-batch k's).
  Placement peer_placement;
  NdSbp peer_sbp;
  std::optional<uint32_t> tag;
  // The request lockstep checks compare between ranks (communicating
  // instructions, with --check_lockstep).
  std::string lockstep_request;
  // Whether running it may exchange data with another rank (what the
  // actor runtime puts on its communication stream): stage transfers, and
  // layout changes and self-running ops on placements of several ranks. A
  // layout change within one rank (a world of one) is a rename or a local
  // copy and runs with the compute.
  bool communicates = false;
};

class ExecPlan {
 public:
  // Lowers the ops of `graph` for `rank`; `runs`, when given, says per op
  // id which ones this rank runs (the others are left unlowered). The
  // graph must outlive the plan. Throws kInternal naming the op if the
  // graph is not one that can run (an op without a kernel for its device,
  // a value without data).
  static ExecPlan Lower(const ir::Graph& graph, int rank, const std::vector<char>* runs = nullptr);

  const ir::Graph& graph() const { return *graph_; }
  int rank() const { return rank_; }
  // The runs of the graph's ops and the slots of its values.
  const passes::StepRuns& runs() const { return *runs_of_; }
  // By op id.
  const std::vector<Instruction>& instructions() const { return instructions_; }
  const Instruction& at(int op) const { return instructions_.at(static_cast<size_t>(op)); }
  // How many this rank runs.
  int64_t instructions_run() const { return runs_; }
  // The runs of the instructions this rank runs, in the order the in-order
  // executor makes them (StepRuns::ProgramOrder).
  const std::vector<passes::OpRun>& program_order() const { return program_order_; }
  // Per slot: the position in program_order() after which an in-order run
  // frees it — its last reader, its producer if nothing reads it, past the
  // end for a named result; -1 for slots no run reads or writes.
  const std::vector<int>& free_after() const { return free_after_; }

  // Runs `instruction` for `micro_batch` (a unit's; -1 for an op of the
  // step) on its inputs (the tensors of StepRuns::InputSlots) and returns
  // its results. A kSend posts its slices and returns them in `posted` when
  // that is given (the caller waits for them), else waits itself. Errors
  // name the graph, the op and the micro-batch.
  std::vector<Tensor> Run(const Instruction& instruction, std::vector<Tensor>& args, int micro_batch = -1,
                          PostedSends* posted = nullptr) const;

  // A kRecv's receives for `micro_batch`, posted: the tensor comes from
  // the result's Wait().
  PostedReceive PostReceive(const Instruction& instruction, int micro_batch = -1) const;

  // A kernel instruction's results on a placement are this rank's bare
  // shards (no global wrapper: the next kernel would only unwrap it, and
  // the two allocations are a large share of a small op's cost); Run wraps
  // them where an instruction needs a global tensor (a layout change, a
  // send, a self-running op). An executor hands its results out through
  // this: `stored` as the global tensor value `value` is.
  Tensor Global(int value, const Tensor& stored) const;

  // One line per instruction this rank runs: what it is, its layouts and,
  // for communication, the collective and bytes.
  std::string ToText() const;

 private:
  std::vector<Tensor> RunUnchecked(const Instruction& instruction, std::vector<Tensor>& args, int micro_batch,
                                   PostedSends* posted) const;

  const ir::Graph* graph_ = nullptr;
  int rank_ = 0;
  int64_t runs_ = 0;
  std::vector<Instruction> instructions_;
  std::shared_ptr<const passes::StepRuns> runs_of_;
  std::vector<passes::OpRun> program_order_;
  std::vector<int> free_after_;
};

}  // namespace plan
}  // namespace tessel
