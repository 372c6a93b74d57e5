#include "runtime/actor_runtime.h"

#include <glog/logging.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/allocator.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/init.h"
#include "core/join.h"
#include "graph/boxing_executor.h"
#include "graph/passes/passes.h"
#include "graph/plan/exec_plan.h"
#include "graph/plan/in_order_executor.h"
#include "runtime/rank_schedule.h"
#include "runtime/worker.h"
#include "sbp/global_tensor.h"

namespace tessel::runtime {
namespace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "F3", or "F3c1" for chunk 1 of a stage holding several.
std::string UnitName(bool backward, int micro_batch, bool weight, int chunk, int chunks) {
  std::string name = std::string(weight ? "W" : backward ? "B" : "F").append(std::to_string(micro_batch));
  if (chunks > 1) name.append("c").append(std::to_string(chunk));
  return name;
}

// A global value computed on another stage, as this rank sees it: its
// layout and no data (the shard of a rank outside the placement is empty).
Tensor OffRankValue(const ir::Value& v) {
  const Box box = LocalBox(v.shape, v.placement, v.nd_sbp, CurrentRank());
  return MakeGlobal(Tensor::Empty(box.shape(), v.dtype), v.shape, v.placement, v.nd_sbp);
}

}  // namespace

// This rank's part of one compiled graph: which ops it runs, on which
// stream, in which order.
struct ActorRuntime::Program : RankSchedule {
  size_t num_ops = 0, num_values = 0;          // of the graph it was built for
  std::vector<passes::OpRun> stream_order[2];  // per stream: runs, in RankSchedule::order
  // Per op: ops of the other stream it must follow without reading their
  // results — an in-place update of a variable and the reads of it on either
  // side (the streams otherwise wait only for the values they read). A run
  // waits for their run RankSchedule::PredRun names.
  std::vector<std::vector<int>> after;
  // Per slot (passes::StepRuns: a value's, or a unit's value's for one
  // micro-batch): its value, the runs of this rank reading it, whether it
  // is a named result's (kept), whether it is an op's result (freed after
  // its last reader).
  std::vector<int> value_of, readers;
  std::vector<char> keep, freed;
  // Slots read here whose value is computed on another stage.
  std::vector<int> off_rank;
  // Per op: the completion queue of a receive (one per source placement,
  // so a message still on its way from one peer stage does not hold back
  // one that arrived from another); -1 for other ops.
  std::vector<int> receive_queue;
  int receive_queues = 0;
  bool sends = false;  // this rank sends stage transfers
  // How many of them may wait for their receivers at once (0: no bound).
  int send_quota = 0;
};

ActorRuntime::ActorRuntime(RuntimeOptions options) : options_(std::move(options)) {
  options_.schedule = ParseSchedule(options_.schedule);  // an unknown name fails here, listing the known
  TESSEL_CHECK(options_.max_pending_sends >= -1)
      << "actor runtime: max_pending_sends " << options_.max_pending_sends
      << "; expected a count >= 1, 0 (the schedule's bound) or -1 (no bound)";
}
ActorRuntime::~ActorRuntime() = default;

std::function<ActorRuntime::Tensors(const ir::Graph&, const ActorRuntime::Tensors&)>
ActorRuntime::Executor() {
  return [this](const ir::Graph& graph, const Tensors& inputs) { return Run(graph, inputs); };
}

const ActorRuntime::Program& ActorRuntime::ProgramFor(const ir::Graph& compiled) {
  // By serial, not address: a graph freed and another made at its address
  // must not run the first one's instructions. (A graph's ops change only
  // while it compiles; the sizes catch a program made before that.)
  auto& cached = programs_[compiled.serial()];
  if (cached && cached->num_ops == compiled.ops().size() && cached->num_values == compiled.values().size())
    return *cached;
  ir::Verify(compiled);  // e.g. a transfer whose two sides disagree on the tensor's spec
  auto p = std::make_unique<Program>();
  p->num_ops = compiled.ops().size();
  p->num_values = compiled.values().size();

  const int rank = CurrentRank();
  static_cast<RankSchedule&>(*p) = ScheduleRank(compiled, rank, options_.schedule);
  const ir::Graph& graph = compiled;
  const std::vector<ir::Op>& ops = graph.ops();
  const passes::StepRuns& runs = p->exec.runs();
  if (p->stages > 1 && p->chunks == 1 && options_.schedule == "1f1b" && p->micro_batches < p->stages) {
    LOG_IF(WARNING, rank == 0)
        << "graph '" << graph.name() << "': 1F1B over " << p->micro_batches << " micro-batches on "
        << p->stages << " stages: the warm-up of stages 0.." << p->stages - p->micro_batches
        << " covers every micro-batch, so they run GPipe's order (all forwards, then all "
           "backwards) and hold every micro-batch's activations; use at least "
        << p->stages << " micro-batches for 1F1B's memory bound";
  }
  const std::vector<int>& mine = p->mine;
  const std::vector<std::vector<int>>& preds = p->preds;
  auto stream_of = [&](const ir::Op& op) {
    return p->exec.at(op.id).communicates ? Stream::kCommunication : Stream::kCompute;
  };
  for (const passes::OpRun& r : p->order)
    p->stream_order[static_cast<int>(stream_of(ops[static_cast<size_t>(r.op)]))].push_back(r);
  p->after.assign(ops.size(), {});
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::Op& op = ops[static_cast<size_t>(mine[i])];
    for (int pred : preds[i]) {
      const ir::Op& before = ops[static_cast<size_t>(mine[static_cast<size_t>(pred)])];
      if (stream_of(before) == stream_of(op)) continue;  // the stream's order keeps it
      bool reads_its_result = false;
      for (int in : op.inputs) reads_its_result |= graph.value(in).producer == before.id;
      if (!reads_its_result) p->after[static_cast<size_t>(op.id)].push_back(before.id);
    }
  }

  if (VLOG_IS_ON(2)) {  // the communication order, to compare between ranks
    for (const passes::OpRun& r : p->stream_order[1]) {
      const ir::Op& op = ops[static_cast<size_t>(r.op)];
      VLOG(2) << "graph '" << graph.name() << "': communication " << r.op << " '" << op.name
              << "' micro-batch " << r.micro_batch << (op.backward ? " backward" : " forward");
    }
  }
  const size_t slots = static_cast<size_t>(runs.slots());
  p->value_of.resize(slots);
  p->freed.assign(slots, 1);
  for (const ir::Value& v : graph.values()) {
    p->value_of[static_cast<size_t>(v.id)] = v.id;
    p->freed[static_cast<size_t>(v.id)] = v.kind == ir::Value::Kind::kOpOutput;
    if (runs.per_micro_batch(v.id) && runs.has_slots(v.id))
      for (int k = 1; k < runs.micro_batches(); ++k)
        p->value_of[static_cast<size_t>(runs.Slot(v.id, k))] = v.id;
  }
  p->readers.assign(slots, 0);
  p->keep.assign(slots, 0);
  for (const auto& [name, id] : graph.outputs()) p->keep[static_cast<size_t>(runs.Slot(id, -1))] = 1;
  std::vector<char> off(slots, 0);
  std::vector<int> in_slots;
  for (const passes::OpRun& r : p->order) {
    const ir::Op& op = ops[static_cast<size_t>(r.op)];
    runs.InputSlots(op, r.micro_batch, &in_slots);
    for (int slot : in_slots) {
      ++p->readers[static_cast<size_t>(slot)];
      const int in = p->value_of[static_cast<size_t>(slot)];
      const int producer = graph.value(in).producer;
      if (producer < 0 || p->runs[static_cast<size_t>(producer)]) continue;
      // Only a transfer reads a value of another stage, for its layout.
      TESSEL_CHECK_CODE(GetOpDef(op.name).communicates && graph.value(in).is_global(), StatusCode::kInternal)
          << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' on stage " << op.stage
          << " reads %" << in << ", computed by op " << producer << " on stage " << ops[producer].stage;
      if (!off[static_cast<size_t>(slot)]) p->off_rank.push_back(slot);
      off[static_cast<size_t>(slot)] = 1;
    }
  }
  for (const auto& [name, id] : graph.outputs()) {
    const int producer = graph.value(id).producer;
    const size_t slot = static_cast<size_t>(runs.Slot(id, -1));
    if (producer >= 0 && !p->runs[static_cast<size_t>(producer)] && !off[slot]) {
      p->off_rank.push_back(static_cast<int>(slot));
      off[slot] = 1;
    }
  }
  p->receive_queue.assign(ops.size(), -1);
  std::vector<Placement> sources;
  for (int id : mine) {
    const plan::Instruction& ins = p->exec.at(id);
    p->sends |= ins.kind == plan::Instruction::Kind::kSend;
    if (ins.kind != plan::Instruction::Kind::kRecv) continue;
    auto found = std::find(sources.begin(), sources.end(), ins.peer_placement);
    p->receive_queue[static_cast<size_t>(id)] = static_cast<int>(found - sources.begin());
    if (found == sources.end()) sources.push_back(ins.peer_placement);
  }
  p->receive_queues = static_cast<int>(sources.size());
  // The stage-transfer quota: the program's, or twice the most micro-batches
  // any stage of the schedule holds at once. A stage's forward sends not yet
  // taken are of micro-batches it holds (their backward has not come back),
  // its backward sends not yet taken of micro-batches the stage before it
  // holds (their backward has not started there), so a correct run stays
  // under it whatever the timing; a stage that runs away waits.
  if (options_.max_pending_sends > 0) {
    p->send_quota = options_.max_pending_sends;
  } else if (options_.max_pending_sends == 0 && p->stage >= 0 && p->stages > 1) {
    int most = 1;
    for (int s = 0; s < p->stages; ++s)
      most = std::max(
          most, MaxInFlight(StageActions(options_.schedule, p->stages, s, p->micro_batches, p->chunks)));
    p->send_quota = 2 * most;
  }
  VLOG(1) << "graph '" << graph.name() << "': rank " << rank << " runs " << mine.size() << " of "
          << ops.size() << " ops on stage " << p->stage << " of " << p->stages << " ("
          << p->stream_order[0].size() << " compute runs, " << p->stream_order[1].size()
          << " communication runs) in " << p->chunks << " chunk(s), " << options_.schedule << " over "
          << p->micro_batches << " micro-batches";
  cached = std::move(p);
  return *cached;
}

namespace {

// What the streams of one step share: the value registers, and the first
// failure.
struct StepState {
  std::mutex mu;
  // Signals a register filled or a failure, to the actors waiting (only
  // when one is: a wake-up per op would cost more than most ops).
  std::condition_variable changed;
  int waiting = 0;
  // Signals a posted send or receive, the end of the streams or a failure,
  // to the completion workers.
  std::condition_variable posted_changed;
  std::vector<Tensor> env;        // per slot (passes::StepRuns)
  std::vector<char> ready;        // per slot
  std::vector<char> done;         // per run (StepRuns::RunIndex): finished (for Program::after)
  std::vector<int> readers_left;  // per slot
  std::string error;              // the first failure; the streams stop at their next actor
  StatusCode error_code = StatusCode::kInternal;
  // Posted sends the completion thread waits for, in order; null: no more.
  std::deque<std::unique_ptr<PostedSends>> sends;
  int pending_sends = 0;  // posted and not yet taken by their receivers
  int max_pending_sends = 0;
  // Posted receives per completion queue (Program::receive_queue), each
  // with its actor's event, completed when the message has arrived.
  struct PendingReceive {
    passes::OpRun run;
    std::unique_ptr<PostedReceive> posted;
    ActorEvent event;
  };
  std::vector<std::deque<PendingReceive>> receives;
  std::vector<std::vector<ActorEvent>> receive_events;  // per queue
  bool streams_done = false;                            // no more sends or receives will be posted

  void Fail(StatusCode code, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) {
      error = what;
      error_code = code;
    }
    changed.notify_all();
    posted_changed.notify_all();
  }
};

// Waits until fewer than max_pending_sends sends are pending; false at the
// timeout or when the step failed meanwhile.
bool WaitForSendRoom(StepState& state, int max_pending_sends, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state.mu);
  ++state.waiting;
  const bool room = state.changed.wait_for(
      lock, timeout, [&] { return state.pending_sends < max_pending_sends || !state.error.empty(); });
  --state.waiting;
  return room && state.error.empty();
}

std::string Describe(const ir::Graph& graph, const ir::Op& op, int micro_batch) {
  std::ostringstream os;
  os << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' (stage " << op.stage;
  if (micro_batch >= 0) os << ", micro-batch " << micro_batch;
  os << ", " << (op.backward ? "backward" : "forward") << ") on rank " << CurrentRank();
  return os.str();
}

}  // namespace

ActorRuntime::Tensors ActorRuntime::Run(const ir::Graph& compiled, const Tensors& inputs) {
  const Program& program = ProgramFor(compiled);
  const ir::Graph& graph = compiled;
  const passes::StepRuns& runs = program.exec.runs();
  // Lockstep checks exchange a fingerprint over the world for every layout
  // change. The two streams change layouts at once, so their exchanges
  // would interleave on the world's connections (Gloo then fails on a
  // message of the wrong size, or hangs); and with several stages ranks
  // run different ops by design.
  TESSEL_CHECK(!LockstepChecksEnabled())
      << "graph '" << graph.name() << "': lockstep checks (--check_lockstep, TESSEL_CHECK_LOCKSTEP) exchange "
      << "a fingerprint over the world for every layout change, from one thread at a time; the actor runtime "
      << "changes layouts on its compute and communication threads at once"
      << (program.stages > 1
              ? " and its " + std::to_string(program.stages) + " pipeline stages run different ops by design"
              : std::string())
      << ". Turn them off to run on the actor runtime (the in-order executor runs under them)";
  const std::vector<ir::Op>& ops = graph.ops();
  StepState state;
  state.env = BindGraphValues(graph, inputs);
  state.env.resize(static_cast<size_t>(runs.slots()));
  state.ready.assign(static_cast<size_t>(runs.slots()), 0);
  for (const ir::Value& v : graph.values()) state.ready[v.id] = v.kind != ir::Value::Kind::kOpOutput;
  for (int slot : program.off_rank) {
    state.env[static_cast<size_t>(slot)] =
        OffRankValue(graph.value(program.value_of[static_cast<size_t>(slot)]));
    state.ready[static_cast<size_t>(slot)] = 1;
  }
  state.readers_left = program.readers;
  state.done.assign(static_cast<size_t>(runs.runs()), 0);
  const std::chrono::milliseconds timeout =
      options_.input_timeout.count() > 0
          ? options_.input_timeout
          : (comm::IsWorldInitialized() ? comm::World().timeout() : std::chrono::milliseconds(300000));

  Allocator* allocator = GetAllocator(Device::CPU());
  const int64_t held_before = allocator->stats().allocated_bytes;
  allocator->ResetPeak();
  std::vector<ActorEvent> events[2];

  auto run_stream = [&](Stream stream) {
    const std::vector<passes::OpRun>& order = program.stream_order[static_cast<int>(stream)];
    std::vector<ActorEvent>& log = events[static_cast<int>(stream)];
    log.reserve(order.size());
    std::vector<Tensor> args;  // reused: one allocation per stream, not per actor
    std::vector<int> in_slots;
    for (const passes::OpRun& run : order) {
      const int id = run.op;
      const ir::Op& op = ops[static_cast<size_t>(id)];
      const int run_index = runs.RunIndex(id, run.micro_batch);
      runs.InputSlots(op, run.micro_batch, &in_slots);
      args.clear();
      {
        std::unique_lock<std::mutex> lock(state.mu);
        // The clock is read only when an actor has to wait (most find their
        // inputs ready: a read per actor is a measurable share of a small op).
        std::optional<std::chrono::steady_clock::time_point> deadline_at;
        auto deadline = [&] {
          if (!deadline_at) deadline_at = std::chrono::steady_clock::now() + timeout;
          return *deadline_at;
        };
        for (int before : program.after[static_cast<size_t>(id)]) {
          const size_t before_run = static_cast<size_t>(program.PredRun(before, id, run.micro_batch));
          if (state.done[before_run]) continue;
          ++state.waiting;
          const bool finished = state.changed.wait_until(
              lock, deadline(), [&] { return state.done[before_run] || !state.error.empty(); });
          --state.waiting;
          if (!finished) {
            state.error = Describe(graph, op, run.micro_batch) + " waited " +
                          std::to_string(timeout.count()) + " ms for op " + std::to_string(before) + " '" +
                          ops[static_cast<size_t>(before)].name +
                          "' (an in-place update ordered with it), which did not finish";
            state.error_code = StatusCode::kTimeout;
            state.changed.notify_all();
          }
          if (!state.error.empty()) return;
        }
        for (int slot : in_slots) {
          if (state.ready[static_cast<size_t>(slot)]) continue;
          ++state.waiting;
          const bool arrived = state.changed.wait_until(lock, deadline(), [&] {
            return state.ready[static_cast<size_t>(slot)] || !state.error.empty();
          });
          --state.waiting;
          if (!arrived) {
            const int in = program.value_of[static_cast<size_t>(slot)];
            const int producer = graph.value(in).producer;
            state.error = Describe(graph, op, run.micro_batch) + " waited " +
                          std::to_string(timeout.count()) + " ms for %" + std::to_string(in) + " from op " +
                          std::to_string(producer) + " '" + ops[static_cast<size_t>(producer)].name +
                          "', which did not run";
            state.error_code = StatusCode::kTimeout;
            state.changed.notify_all();
          }
          if (!state.error.empty()) return;
        }
        args.reserve(in_slots.size());
        for (int slot : in_slots) args.push_back(state.env[static_cast<size_t>(slot)]);
      }
      ActorEvent event{.op = id,
                       .stream = stream,
                       .micro_batch = run.micro_batch,
                       .chunk = program.ChunkOf(op.stage),
                       .backward = op.backward,
                       .weight = program.weight[static_cast<size_t>(id)] != 0,
                       .start_us = NowMicros()};
      std::vector<Tensor> outs;
      const plan::Instruction& instruction = program.exec.at(id);
      try {
        if (instruction.kind == plan::Instruction::Kind::kSend) {
          if (program.send_quota > 0 && !WaitForSendRoom(state, program.send_quota, timeout)) {
            // (Fail keeps an earlier failure: then this one is not news.)
            state.Fail(StatusCode::kTimeout,
                       Describe(graph, op, run.micro_batch) + " waited " + std::to_string(timeout.count()) +
                           " ms for the " + std::to_string(program.send_quota) +
                           " earlier send(s) of this rank to be taken by their receivers");
            return;
          }
          // Posted, not waited for: the completion thread waits.
          auto posted = std::make_unique<PostedSends>();
          program.exec.Run(instruction, args, run.micro_batch, posted.get());
          std::lock_guard<std::mutex> lock(state.mu);
          state.sends.push_back(std::move(posted));
          state.max_pending_sends = std::max(state.max_pending_sends, ++state.pending_sends);
          state.posted_changed.notify_all();
        } else if (instruction.kind == plan::Instruction::Kind::kRecv) {
          // Posted, not waited for: its queue's completion worker waits and
          // fills the register, while this stream goes on.
          auto posted =
              std::make_unique<PostedReceive>(program.exec.PostReceive(instruction, run.micro_batch));
          std::lock_guard<std::mutex> lock(state.mu);
          state.receives[static_cast<size_t>(program.receive_queue[static_cast<size_t>(id)])].push_back(
              {run, std::move(posted), event});
          state.posted_changed.notify_all();
        } else {
          outs = program.exec.Run(instruction, args, run.micro_batch);
        }
      } catch (const Error& e) {
        state.Fail(e.code(), Describe(graph, op, run.micro_batch) + " failed: " + e.what());
        return;
      } catch (const std::exception& e) {
        state.Fail(StatusCode::kInternal, Describe(graph, op, run.micro_batch) + " failed: " + e.what());
        return;
      }
      args.clear();
      const bool completes_later = instruction.kind == plan::Instruction::Kind::kRecv;
      event.end_us = NowMicros();
      if (!completes_later) log.push_back(event);
      std::lock_guard<std::mutex> lock(state.mu);
      if (!completes_later) state.done[static_cast<size_t>(run_index)] = 1;
      for (size_t o = 0; o < outs.size(); ++o) {
        const size_t slot = static_cast<size_t>(runs.OutputSlot(op, o, run.micro_batch));
        if (program.readers[slot] > 0 || program.keep[slot]) state.env[slot] = std::move(outs[o]);
        state.ready[slot] = 1;
      }
      // A result is freed after this rank's last reader (named results stay).
      for (int slot : in_slots) {
        const size_t s = static_cast<size_t>(slot);
        if (--state.readers_left[s] == 0 && !program.keep[s] && program.freed[s]) state.env[s] = Tensor();
      }
      if (state.waiting > 0) state.changed.notify_all();
    }
  };

  // Waits for posted sends in order, until both streams are done.
  auto complete_sends = [&] {
    for (;;) {
      std::unique_ptr<PostedSends> next;
      {
        std::unique_lock<std::mutex> lock(state.mu);
        state.posted_changed.wait(lock, [&] { return !state.sends.empty() || state.streams_done; });
        if (state.sends.empty()) return;
        next = std::move(state.sends.front());
        state.sends.pop_front();
      }
      try {
        next->Wait();
      } catch (const Error& e) {
        state.Fail(e.code(), "graph '" + graph.name() + "': a send to another stage failed on rank " +
                                 std::to_string(CurrentRank()) + ": " + e.what());
        // The other sends still complete or time out on their own.
      }
      next.reset();  // the slices' memory goes back before a waiting send posts more
      std::lock_guard<std::mutex> lock(state.mu);
      --state.pending_sends;
      if (state.waiting > 0) state.changed.notify_all();
    }
  };

  // Waits for the posted receives of queue `q` in order, filling each
  // one's register as it arrives, until both streams are done.
  auto complete_receives = [&](size_t q) {
    std::vector<ActorEvent>& log = state.receive_events[q];
    for (;;) {
      StepState::PendingReceive next;
      {
        std::unique_lock<std::mutex> lock(state.mu);
        state.posted_changed.wait(lock, [&] { return !state.receives[q].empty() || state.streams_done; });
        if (state.receives[q].empty()) return;
        next = std::move(state.receives[q].front());
        state.receives[q].pop_front();
      }
      const ir::Op& op = ops[static_cast<size_t>(next.run.op)];
      Tensor received;
      try {
        received = next.posted->Wait();
      } catch (const Error& e) {
        state.Fail(e.code(), Describe(graph, op, next.run.micro_batch) + " failed: " + e.what());
        continue;  // the other receives still complete or time out on their own
      }
      next.posted.reset();
      next.event.end_us = NowMicros();
      log.push_back(next.event);
      std::lock_guard<std::mutex> lock(state.mu);
      state.done[static_cast<size_t>(runs.RunIndex(op.id, next.run.micro_batch))] = 1;
      const size_t slot = static_cast<size_t>(runs.OutputSlot(op, 0, next.run.micro_batch));
      if (program.readers[slot] > 0 || program.keep[slot]) state.env[slot] = std::move(received);
      state.ready[slot] = 1;
      if (state.waiting > 0) state.changed.notify_all();
    }
  };

  state.receives.resize(static_cast<size_t>(program.receive_queues));
  state.receive_events.resize(static_cast<size_t>(program.receive_queues));
  if (!communication_) communication_ = std::make_unique<Worker>();
  if (!sends_) sends_ = std::make_unique<Worker>();
  while (receivers_.size() < static_cast<size_t>(program.receive_queues))
    receivers_.push_back(std::make_unique<Worker>());
  // Workers with nothing to do this step stay asleep: waking a thread and
  // waiting for it costs tens of microseconds, a whole small step.
  const bool communicates = !program.stream_order[static_cast<int>(Stream::kCommunication)].empty();
  const int64_t start = NowMicros();
  if (program.sends) sends_->Start(complete_sends);
  for (int q = 0; q < program.receive_queues; ++q)
    receivers_[static_cast<size_t>(q)]->Start([&, q] { complete_receives(static_cast<size_t>(q)); });
  if (communicates) communication_->Start([&] { run_stream(Stream::kCommunication); });
  run_stream(Stream::kCompute);
  if (communicates) communication_->Wait();
  {
    std::lock_guard<std::mutex> lock(state.mu);
    state.streams_done = true;
    state.posted_changed.notify_all();
  }
  if (program.sends) sends_->Wait();
  for (int q = 0; q < program.receive_queues; ++q) receivers_[static_cast<size_t>(q)]->Wait();
  if (!state.error.empty()) TESSEL_THROW(state.error_code) << state.error;

  last_ = StepReport{};
  last_.rank = CurrentRank();
  last_.stage = program.stage;
  last_.stages = program.stages;
  last_.chunks = program.chunks;
  last_.micro_batches = program.micro_batches;
  last_.schedule = options_.schedule;
  last_.max_pending_sends = state.max_pending_sends;
  last_.send_quota = program.send_quota;
  last_.peak_bytes = allocator->stats().peak_allocated_bytes - held_before;
  last_.start_us = start;
  last_.end_us = NowMicros();
  last_.events = std::move(events[0]);
  last_.events.insert(last_.events.end(), events[1].begin(), events[1].end());
  for (const std::vector<ActorEvent>& received : state.receive_events)
    last_.events.insert(last_.events.end(), received.begin(), received.end());
  // Units in the order the compute stream began them; in flight: forwards
  // begun whose backward (and weight-gradient part) has not ended, each
  // chunk's apart.
  const size_t units = static_cast<size_t>(program.micro_batches * program.chunks);
  std::vector<char> seen(3 * units, 0);
  std::vector<int64_t> backward_end(units, 0);
  std::vector<int64_t> forward_start(units, -1);
  for (const ActorEvent& e : last_.events) {
    if (e.stream != Stream::kCompute || e.micro_batch < 0) continue;
    const size_t u = static_cast<size_t>(e.chunk * program.micro_batches + e.micro_batch);
    const size_t kind = e.weight ? 2 : e.backward ? 1 : 0;
    if (!seen[3 * u + kind]) last_.actions.push_back({e.backward, e.micro_batch, e.weight, e.chunk});
    seen[3 * u + kind] = 1;
    if (e.backward) backward_end[u] = std::max(backward_end[u], e.end_us);
    if (!e.backward && forward_start[u] < 0) forward_start[u] = e.start_us;
  }
  for (int64_t t : forward_start) {
    if (t < 0) continue;
    int live = 0;
    for (size_t j = 0; j < forward_start.size(); ++j)
      live += forward_start[j] >= 0 && forward_start[j] <= t && (backward_end[j] == 0 || backward_end[j] > t);
    last_.max_in_flight = std::max(last_.max_in_flight, live);
  }
  if (!options_.timeline_dir.empty()) {
    std::filesystem::create_directories(options_.timeline_dir);
    const std::string path =
        options_.timeline_dir + "/timeline_rank" + std::to_string(CurrentRank()) + ".json";
    std::ofstream out(path);
    out << TimelineJson(compiled);
    TESSEL_CHECK(out.good()) << "could not write the timeline to " << path;
  }

  Tensors results;
  for (const auto& [name, id] : graph.outputs())
    results[name] = program.exec.Global(id, state.env[static_cast<size_t>(runs.Slot(id, -1))]);
  return results;
}

std::string ActorRuntime::TimelineJson(const ir::Graph& compiled) const {
  const ir::Graph& graph = compiled;
  const StepReport& r = last_;
  std::ostringstream os;
  os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  os << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << r.rank << ",\"args\":{\"name\":\"rank "
     << r.rank << " (stage " << r.stage << (r.chunks > 1 ? ", " + std::to_string(r.chunks) + " chunks" : "")
     << ")\"}},\n";
  const char* tracks[] = {"compute", "communication", "schedule"};
  for (int t = 0; t < 3; ++t)
    os << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << r.rank << ",\"tid\":" << t
       << ",\"args\":{\"name\":\"" << tracks[t] << "\"}},\n";
  auto event = [&](const std::string& name, const char* cat, int tid, int64_t start, int64_t end,
                   int micro_batch, int chunk, int op) {
    os << "{\"ph\":\"X\",\"name\":\"" << name << "\",\"cat\":\"" << cat << "\",\"pid\":" << r.rank
       << ",\"tid\":" << tid << ",\"ts\":" << start << ",\"dur\":" << std::max<int64_t>(end - start, 0)
       << ",\"args\":{\"stage\":" << r.stage << ",\"micro_batch\":" << micro_batch << ",\"chunk\":" << chunk;
    if (op >= 0) os << ",\"op\":" << op;
    os << "}},\n";
  };
  // Units: from the first to the last compute actor of (chunk, pass,
  // micro-batch). Pass 0 forward, 1 backward, 2 a split backward's weight
  // gradients.
  std::map<std::tuple<int, int, int>, std::pair<int64_t, int64_t>> units;  // -> span
  const char* pass_names[] = {"forward", "backward", "weight"};
  for (const ActorEvent& e : r.events) {
    const int pass = e.weight ? 2 : e.backward ? 1 : 0;
    const char* cat = e.micro_batch < 0 ? "step" : pass_names[pass];
    event(graph.ops().at(static_cast<size_t>(e.op)).name, cat, static_cast<int>(e.stream), e.start_us,
          e.end_us, e.micro_batch, e.chunk, e.op);
    if (e.stream != Stream::kCompute || e.micro_batch < 0) continue;
    auto [it, is_new] = units.try_emplace({e.chunk, pass, e.micro_batch}, e.start_us, e.end_us);
    it->second.first = std::min(it->second.first, e.start_us);
    it->second.second = std::max(it->second.second, e.end_us);
  }
  for (const auto& [key, span] : units) {
    const auto [chunk, pass, micro_batch] = key;
    event(UnitName(pass != 0, micro_batch, pass == 2, chunk, r.chunks), pass_names[pass], 2, span.first,
          span.second, micro_batch, chunk, -1);
  }
  // The step itself closes the list (no trailing comma to strip).
  os << "{\"ph\":\"X\",\"name\":\"step\",\"cat\":\"step\",\"pid\":" << r.rank
     << ",\"tid\":2,\"ts\":" << r.start_us << ",\"dur\":" << r.end_us - r.start_us
     << ",\"args\":{\"stage\":" << r.stage << ",\"stages\":" << r.stages << ",\"chunks\":" << r.chunks
     << ",\"micro_batches\":" << r.micro_batches << ",\"schedule\":\"" << r.schedule << "\"}}\n";
  os << "]}\n";
  return os.str();
}

}  // namespace tessel::runtime
