// The actor runtime: runs this rank's part of a compiled graph (the ops of
// its pipeline stage, graph/passes: stage_assignment), lowered once to its
// executable plan (graph/plan/exec_plan.h), with one actor per op on two
// streams — compute (this caller's thread) and communication (a worker the
// runtime keeps) — so layout changes, fused gradient reductions and stage
// transfers run while compute goes on.
//
// Each stream runs its actors in a fixed order: the rank's ops sorted by
// dependence, and among ready ones by the pipeline schedule's slot of their
// (micro-batch, forward or backward) on this stage (runtime/
// pipeline_schedule.h), so GPipe and 1F1B come out of the order. An actor
// waits for its inputs (registers filled by the actors producing them);
// every rank of a communication group issues the group's calls in the same
// order because the orders are computed from the same graph. Stage
// transfers never block the communication stream: a send posts its slices
// and a receive posts its buffers, and completion workers (one for sends,
// one per source of receives) wait for them — the receive's register is
// filled when its message arrives, so a slow stage does not hold back the
// tensor-parallel and data-parallel collectives behind it. A result is
// freed once this rank's last reader has run. A step creates no thread.
//
// An actor that fails, or waits for an input longer than the timeout, stops
// the step: the error names the op, its stage, micro-batch and pass, and the
// other stream stops at its next actor.
//
//   runtime::ActorRuntime actors({.schedule = "1f1b"});
//   Graph step("step", build, {.micro_batches = 8, ..., .executor = actors.Executor()});
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/ir/graph_ir.h"
#include "runtime/pipeline_schedule.h"

namespace tessel::runtime {

class Worker;

struct RuntimeOptions {
  // A registered pipeline schedule (runtime/pipeline_schedule.h): "1f1b",
  // "gpipe" or one the program registered.
  std::string schedule = "1f1b";
  // How long an actor waits for an input this rank produces before the step
  // fails; 0: the world communicator's timeout.
  std::chrono::milliseconds input_timeout{0};
  // The register count of stage transfers: how many of this rank's sends
  // may wait for their receivers at once. A send beyond it waits until an
  // earlier one is taken (up to the input timeout), so a stage cannot run
  // ahead of the next by more than this many messages nor hold more send
  // buffers. 0 (the default): derived from the schedule, twice the most
  // micro-batches any stage holds at once (StepReport::send_quota) — a
  // bound a correct run never reaches (a stage's pending forward sends are
  // micro-batches it holds, its pending backward sends ones its previous
  // stage holds), so it changes nothing until a stage runs away. -1: no
  // bound.
  int max_pending_sends = 0;
  // When set, every step writes this rank's timeline there as
  // timeline_rank<r>.json (Chrome trace: open it in Perfetto or
  // chrome://tracing; tools/pipeline_timeline.py draws the pipeline).
  std::string timeline_dir = {};
};

enum class Stream { kCompute = 0, kCommunication = 1 };

// One actor's run on this rank.
struct ActorEvent {
  int op = 0;  // id in the compiled graph
  Stream stream = Stream::kCompute;
  int micro_batch = -1;
  int chunk = 0;  // the model chunk, when the stage holds several
  bool backward = false;
  bool weight = false;               // of a split backward's weight-gradient (W) part
  int64_t start_us = 0, end_us = 0;  // steady clock (shared by the processes of a machine)
};

// What the last step did on this rank.
struct StepReport {
  int rank = 0;
  int stage = 0, stages = 1, micro_batches = 1;
  int chunks = 1;  // model chunks (virtual stages) on this stage: interleaved pipelines
  std::string schedule = "1f1b";
  // The forward, backward (and weight-gradient) units of this stage in the
  // order the compute stream began them (a unit is the ops of one
  // micro-batch's forward or backward, or of a split backward's part, on
  // this stage, or on one of its chunks).
  std::vector<Action> actions;
  // The most micro-batches whose forward had begun and backward had not
  // ended: how many micro-batches' activations the stage held at once.
  int max_in_flight = 0;
  // The most sends waiting for their receivers at once (at most
  // send_quota).
  int max_pending_sends = 0;
  // The register count of stage transfers this step ran with
  // (RuntimeOptions::max_pending_sends, or the schedule's bound); 0: none.
  int send_quota = 0;
  // The most CPU memory the step held at once beyond what it started with.
  int64_t peak_bytes = 0;
  int64_t start_us = 0, end_us = 0;
  std::vector<ActorEvent> events;  // in each stream's order
};

class ActorRuntime {
 public:
  using Tensors = std::map<std::string, Tensor>;
  explicit ActorRuntime(RuntimeOptions options = {});
  ~ActorRuntime();

  // Runs `graph` (compiled: boxing explicit, stages assigned) with these
  // inputs, bound by name as RunInOrder binds them, and returns its named
  // results. A result computed on another stage comes back as a global
  // tensor with no data on this rank.
  Tensors Run(const ir::Graph& graph, const Tensors& inputs);
  // For GraphOptions::executor; the runtime must outlive the Graph's calls.
  std::function<Tensors(const ir::Graph&, const Tensors&)> Executor();

  const StepReport& last_step() const { return last_; }
  // Where the next steps write their timelines (RuntimeOptions::timeline_dir;
  // "" stops them): a trainer traces the iterations it was asked for.
  void set_timeline_dir(std::string dir) { options_.timeline_dir = std::move(dir); }
  // The last step as Chrome-trace JSON: one track per stream, with each
  // actor's op, stage and micro-batch, and a "schedule" track of the F, B
  // (and W) units named "F3", "B2", "W1".
  // `graph` is the one Run was given.
  std::string TimelineJson(const ir::Graph& graph) const;

 private:
  struct Program;
  const Program& ProgramFor(const ir::Graph& graph);

  RuntimeOptions options_;
  std::map<uint64_t, std::unique_ptr<Program>> programs_;  // by ir::Graph::serial()
  // Threads that live as long as the runtime: the communication stream,
  // the posted sends' completion and one per receive queue.
  std::unique_ptr<Worker> communication_, sends_;
  std::vector<std::unique_ptr<Worker>> receivers_;
  StepReport last_;
};

}  // namespace tessel::runtime
