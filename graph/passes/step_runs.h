// The runs of a step: what an executor runs of a compiled graph, and where
// each run's tensors live.
//
// Gradient accumulation leaves the forward and backward once, as micro-batch
// units (Op::micro_batch 0, Graph::micro_batch_units() = m; see passes.h),
// and every pass after it keeps them so. They are not copied: a unit op runs
// m times, once per micro-batch, and every other op (the step's: layout
// changes of variables, gradient buckets, clipping, the optimizer) once. A
// run is (op, micro-batch): (op, k) for a unit, (op, -1) for an op of the
// step. A graph without units runs each op once, as (op, Op::micro_batch).
//
// A step keeps its tensors in a table of slots. A value computed by a unit
// has one slot per micro-batch; every other value (a variable, an input, a
// result of the step's ops) one. A `micro_batch_sum` is the running sum:
// its run for micro-batch k writes the sum so far into slot k (micro-batch
// 0's share itself, then `add`(sum so far, share k)), and the ops of the
// step read slot m - 1, the whole sum. Slot k of value v is v itself for
// k = 0, so a graph without units has one slot per value, numbered as the
// values are.
//
// Stage transfers of micro-batch k take the op's message tag plus k times
// the tags per micro-batch (StepRuns::Tag), so both sides of a pair agree without an
// exchange.
//
//   const passes::StepRuns runs(graph);  // checks the units (see below)
//   for (const passes::OpRun& r : runs.ProgramOrder()) {
//     runs.InputSlots(graph.ops()[r.op], r.micro_batch, &in);
//     ... env[runs.OutputSlot(op, o, r.micro_batch)] = result o ...
//   }
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "graph/ir/graph_ir.h"

namespace tessel::passes {

struct OpRun {
  int op = 0;
  // The micro-batch a unit's run works on; -1 for an op of the step (in a
  // graph without units, the op's own Op::micro_batch).
  int micro_batch = -1;
  bool operator==(const OpRun&) const = default;
};

class StepRuns {
 public:
  // Throws kInternal, naming the op, if the units cannot run as such: an op
  // of the step among the units that reads a micro-batch's value or that
  // updates a value in place, or reads what a unit updates in place; a unit
  // reading a sum; a named result each micro-batch computes. Throws
  // kInvalidArgument naming the counts if the stage transfers of every
  // micro-batch need more message tags than a step has (2^24).
  //
  // With `ops` (per op id: one rank's ops), only the ops it marks have runs
  // and only the values they read or write have a unit's extra slots, so a
  // rank's tables grow with its own part of the step, not the world's (a
  // 16-stage pipeline's rank numbers 1/16 of the graph's slots). The checks
  // still cover the whole graph.
  explicit StepRuns(const ir::Graph& graph, const std::vector<char>* ops = nullptr);

  // How many times a unit runs (1 for a graph without units).
  int micro_batches() const { return micro_batches_; }
  // Whether op `op` is a unit (runs once per micro-batch).
  bool unit(int op) const { return unit_[static_cast<size_t>(op)] != 0; }
  // Whether op `op` is a unit's micro_batch_sum (a running sum).
  bool sum(int op) const { return sum_[static_cast<size_t>(op)] != 0; }
  // Whether op `op` has runs here (every op without `ops`).
  bool numbered(int op) const { return numbered_[static_cast<size_t>(op)] != 0; }
  // The runs of the numbered ops, and the index of each: an op's runs are
  // consecutive, micro-batch 0 first.
  int runs() const { return runs_; }
  int RunIndex(int op, int micro_batch) const {
    return first_run_[static_cast<size_t>(op)] + (unit(op) ? micro_batch : 0);
  }
  // All runs of `op`.
  int RunsOf(int op) const { return unit(op) ? micro_batches_ : 1; }

  int slots() const { return slots_; }
  bool per_micro_batch(int value) const { return extra_[static_cast<size_t>(value)] != kOneSlot; }
  // Whether all of the value's slots are numbered here: every value but a
  // unit's that no numbered op reads or writes (only its slot 0 is).
  bool has_slots(int value) const { return extra_[static_cast<size_t>(value)] != kNoSlotsHere; }
  // The slot of `value` as the run of micro-batch `micro_batch` reads or
  // writes it; -1 (an op of the step): the value's only slot, or a sum's
  // last (the whole sum). Throws kInternal for a unit's value no numbered
  // op reads or writes, past micro-batch 0.
  int Slot(int value, int micro_batch) const;
  // What the run of `op` for `micro_batch` reads, in the op's order; a
  // micro_batch_sum's run for k > 0 reads the sum so far, then its share.
  void InputSlots(const ir::Op& op, int micro_batch, std::vector<int>* slots) const;
  int OutputSlot(const ir::Op& op, size_t output, int micro_batch) const {
    return Slot(op.outputs[output], unit(op.id) ? micro_batch : -1);
  }

  // The runs in the order the in-order executor makes them: the step's ops
  // before the units, and those among them that read nothing the units
  // compute (a variable's layout change a unit reads); then every unit for
  // micro-batch 0, 1, ...; then the rest in program order. Numbered ops
  // only; with `runs` (per op id), only those of them it marks.
  std::vector<OpRun> ProgramOrder(const std::vector<char>* runs = nullptr) const;
  // Whether op `op` of the step runs after the units (ProgramOrder).
  bool after_units(int op) const { return after_[static_cast<size_t>(op)] != 0; }

  // The message tag of a transfer op's run (the stride per micro-batch is
  // one more than the largest stage-transfer tag).
  uint32_t Tag(int op, uint32_t tag, int micro_batch) const {
    return unit(op) ? tag + static_cast<uint32_t>(micro_batch * tags_) : tag;
  }

 private:
  const ir::Graph* graph_;
  int micro_batches_ = 1, runs_ = 0, slots_ = 0;
  int64_t tags_ = 0;
  static constexpr int kOneSlot = -1, kNoSlotsHere = -2;
  std::vector<char> unit_, after_, sum_, numbered_;  // per op
  std::vector<int> first_run_;                       // per op
  std::vector<int> unit_ops_;                        // the units' op ids, in program order
  // Per value: its slot for micro-batch 1; kOneSlot, or kNoSlotsHere (a
  // unit's value no numbered op reads or writes).
  std::vector<int> extra_;
};

// The (virtual) pipeline stages whose ops compute on a placement holding
// `rank` (or, for a send, read from one).
std::set<int> StagesHeldBy(const ir::Graph& graph, int rank);

}  // namespace tessel::passes
