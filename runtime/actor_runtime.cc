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
struct ActorRuntime::Program {
  size_t num_ops = 0, num_values = 0;  // of the graph it was built for
  // This rank's stage of `stages`, holding `chunks` model chunks (virtual
  // stages stage, stage + stages, ...; Op::stage is the virtual stage).
  int stage = 0, stages = 1, chunks = 1, micro_batches = 1;
  // The model chunk of an op of `virtual_stage` (0 for local ops).
  int ChunkOf(int virtual_stage) const { return virtual_stage < 0 ? 0 : virtual_stage / stages; }
  std::vector<char> runs;  // per op
  // Per op: a backward op of the weight-gradient (W) part of its
  // micro-batch, when the schedule lists W units.
  std::vector<char> weight;
  std::vector<int> order[2];  // per stream: op ids
  // Per op: ops of the other stream it must follow without reading their
  // results — an in-place update of a variable and the reads of it on either
  // side (the streams otherwise wait only for the values they read).
  std::vector<std::vector<int>> after;
  std::vector<int> readers;   // per value: this rank's ops reading it
  std::vector<char> keep;     // per value: a named result
  std::vector<int> off_rank;  // values read here and computed on another stage
  // This rank's ops lowered to instructions (the others are not lowered).
  plan::ExecPlan exec;
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

const ActorRuntime::Program& ActorRuntime::ProgramFor(const ir::Graph& graph) {
  // By serial, not address: a graph freed and another made at its address
  // must not run the first one's instructions. (A graph's ops change only
  // while it compiles; the sizes catch a program made before that.)
  auto& cached = programs_[graph.serial()];
  if (cached && cached->num_ops == graph.ops().size() && cached->num_values == graph.values().size())
    return *cached;
  ir::Verify(graph);  // e.g. a transfer whose two sides disagree on the tensor's spec
  auto p = std::make_unique<Program>();
  const std::vector<ir::Op>& ops = graph.ops();
  p->num_ops = ops.size();
  p->num_values = graph.values().size();

  // This rank's stage: the one whose ops compute on (or, for sends, read
  // from) a placement holding it; under an interleaved pipeline, the
  // virtual stages it holds, one per model chunk.
  const int rank = CurrentRank();
  int virtual_stages = 0, micro_batches = 1;
  std::set<int> mine_stages;
  for (const ir::Op& op : ops) {
    micro_batches = std::max(micro_batches, op.micro_batch + 1);
    if (op.stage < 0) continue;
    virtual_stages = std::max(virtual_stages, op.stage + 1);
    bool holds = false;
    for (int o : op.outputs) holds |= graph.value(o).placement.Contains(rank);
    if (op.name == "send") holds |= graph.value(op.inputs[0]).placement.Contains(rank);
    if (holds) mine_stages.insert(op.stage);
  }
  p->chunks = std::max<int>(static_cast<int>(mine_stages.size()), 1);
  p->stages = std::max(virtual_stages / p->chunks, 1);
  // A rank on no stage of a pipeline runs the local ops only (stage -1).
  p->stage = !mine_stages.empty() ? *mine_stages.begin() : virtual_stages == 0 ? 0 : -1;
  int expected = p->stage;
  for (int s : mine_stages) {
    TESSEL_CHECK_CODE(s == expected && virtual_stages % p->chunks == 0, StatusCode::kInternal)
        << "graph '" << graph.name() << "': rank " << rank << " computes on stages {"
        << Join(std::vector<int>(mine_stages.begin(), mine_stages.end())) << "} of " << virtual_stages
        << "; expected one stage, or one virtual stage in each of its chunks (" << p->stage << ", "
        << p->stage + p->stages << ", ...)";
    expected += p->stages;
  }
  p->micro_batches = micro_batches;
  // Every rank checks the whole pipeline's orders, so a schedule whose
  // stages disagree or would wait on each other fails on every rank before
  // a step runs.
  const std::string wrong = CheckSchedule(options_.schedule, p->stages, micro_batches, p->chunks);
  TESSEL_CHECK(wrong.empty()) << "graph '" << graph.name() << "': " << wrong;
  if (p->stages > 1 && p->chunks == 1 && options_.schedule == "1f1b" && micro_batches < p->stages) {
    LOG_IF(WARNING, rank == 0)
        << "graph '" << graph.name() << "': 1F1B over " << micro_batches << " micro-batches on " << p->stages
        << " stages: the warm-up of stages 0.." << p->stages - micro_batches
        << " covers every micro-batch, so they run GPipe's order (all forwards, then all "
           "backwards) and hold every micro-batch's activations; use at least "
        << p->stages << " micro-batches for 1F1B's memory bound";
  }

  // The schedule's slot of each (pass, micro-batch) on this stage. Ops of
  // no micro-batch keep their side of the micro-batches: those before
  // every micro-batch op (hoisted out of the copies) come first. Those a
  // communication reads (a gradient's average, for its bucket) rank with
  // their latest input, so a layer's gradient is averaged and its bucket
  // reduced while the last backward goes on with earlier layers. The
  // others (the gradient norm, clipping, the optimizer), stage transfers,
  // ops with no input on this rank and ops reading a communication's
  // result (placed early, they would stall their stream until it ends)
  // come after every unit in program order. Every
  // rank then orders its transfers as its peers do: a receive with no
  // input here would otherwise be ready at once and wait, first in its
  // stream, for a send made at the very end, and a send moved ahead would
  // reach a receive posted for another message.
  // Slots per micro-batch k of chunk c, u = c m + k: 3u forward, 3u + 1
  // backward, 3u + 2 its weight-gradient part (the backward's slot when the
  // schedule lists no W).
  const size_t units = static_cast<size_t>(micro_batches * p->chunks);
  auto unit_of = [&](int chunk, int micro_batch) {
    return static_cast<size_t>(chunk * micro_batches + micro_batch);
  };
  std::vector<int64_t> slot_of(3 * units, 0);
  int first_micro_batch_op = static_cast<int>(ops.size());
  for (const ir::Op& op : ops)
    if (op.micro_batch >= 0) first_micro_batch_op = std::min(first_micro_batch_op, op.id);
  bool split_backward = false;
  if (p->stage >= 0) {
    const std::vector<Action> actions =
        StageActions(options_.schedule, p->stages, p->stage, micro_batches, p->chunks);
    for (size_t i = 0; i < actions.size(); ++i) {
      const size_t u = unit_of(actions[i].chunk, actions[i].micro_batch);
      slot_of[3 * u + (actions[i].weight ? 2 : actions[i].backward ? 1 : 0)] = static_cast<int64_t>(i);
      split_backward |= actions[i].weight;
    }
    if (!split_backward)
      for (size_t u = 0; u < units; ++u) slot_of[3 * u + 2] = slot_of[3 * u + 1];
  }
  p->runs.assign(ops.size(), 0);
  for (const ir::Op& op : ops)
    p->runs[op.id] = op.stage < 0 || (p->stage >= 0 && op.stage % p->stages == p->stage);
  p->exec = plan::ExecPlan::Lower(graph, rank, &p->runs);

  const std::vector<std::vector<int>> all_preds = ir::Predecessors(graph);
  std::vector<int> mine;  // op ids this rank runs, program order
  for (const ir::Op& op : ops)
    if (p->runs[op.id]) mine.push_back(op.id);
  std::vector<int> index_of(ops.size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) index_of[static_cast<size_t>(mine[i])] = static_cast<int>(i);
  std::vector<std::vector<int>> preds(mine.size());
  std::vector<int64_t> priority(mine.size());
  const int64_t n = static_cast<int64_t>(ops.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::Op& op = ops[static_cast<size_t>(mine[i])];
    // Edges from other stages' ops are kept by the transfers themselves.
    for (int pred : all_preds[op.id])
      if (index_of[static_cast<size_t>(pred)] >= 0) preds[i].push_back(index_of[static_cast<size_t>(pred)]);
  }
  // A split backward: its B part is what the gradient sent to the previous
  // stage needs (the sends of the micro-batch's backward and everything of
  // that backward they depend on); the rest, weight gradients and their
  // accumulation, is its W part. A first stage sends nothing back, so all
  // of its backward is W. (A chunk's B part is that of its own backward.)
  p->weight.assign(ops.size(), 0);
  if (split_backward) {
    std::vector<char> feeds_send(mine.size(), 0);
    std::vector<size_t> stack;
    for (size_t i = 0; i < mine.size(); ++i) {
      const ir::Op& op = ops[static_cast<size_t>(mine[i])];
      if (op.name == "send" && op.backward && op.micro_batch >= 0) stack.push_back(i);
    }
    while (!stack.empty()) {
      const size_t i = stack.back();
      stack.pop_back();
      if (feeds_send[i]) continue;
      feeds_send[i] = 1;
      const ir::Op& op = ops[static_cast<size_t>(mine[i])];
      for (int pred : preds[i]) {
        const ir::Op& before = ops[static_cast<size_t>(mine[static_cast<size_t>(pred)])];
        if (before.backward && before.micro_batch == op.micro_batch &&
            (before.stage < 0 || op.stage < 0 || before.stage == op.stage))
          stack.push_back(static_cast<size_t>(pred));
      }
    }
    for (size_t i = 0; i < mine.size(); ++i) {
      const ir::Op& op = ops[static_cast<size_t>(mine[i])];
      p->weight[static_cast<size_t>(op.id)] = op.backward && op.micro_batch >= 0 && !feeds_send[i];
    }
  }
  // Communications and the ops whose result one reads (a gradient's
  // average and the data-parallel bucket reducing it) are worth running
  // early, beside the last backward, and ops a unit needs (directly or
  // through others) must. The others after the units (the gradient norm's
  // squares, the clipping, the optimizer) wait for every unit: ranked with
  // their input they would run inside the last backward, ahead of its
  // transfer to the previous stage, which waits for it (tens of
  // milliseconds of bubble on a 2-stage GPT).
  std::vector<char> feeds_communication(mine.size(), 0), unit_needs(mine.size(), 0);
  for (size_t i = mine.size(); i-- > 0;) {
    const bool unit = ops[static_cast<size_t>(mine[i])].micro_batch >= 0;
    for (int pred : preds[i]) {
      feeds_communication[static_cast<size_t>(pred)] |= p->exec.at(mine[i]).communicates;
      unit_needs[static_cast<size_t>(pred)] |= unit || unit_needs[i];
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::Op& op = ops[static_cast<size_t>(mine[i])];
    const bool after_units = op.micro_batch < 0 && op.id > first_micro_batch_op;
    bool waits_for_communication = false;  // ranked early, it would stall its stream on the other
    for (int pred : preds[i])
      waits_for_communication |= p->exec.at(mine[static_cast<size_t>(pred)]).communicates;
    const bool early = p->exec.at(mine[i]).communicates || feeds_communication[i] || unit_needs[i];
    if (after_units && !preds[i].empty() && !waits_for_communication && early && op.name != "send" &&
        op.name != "recv") {
      priority[i] = 0;  // with its latest input (preds come first in program order)
      for (int pred : preds[i]) priority[i] = std::max(priority[i], priority[static_cast<size_t>(pred)]);
      continue;
    }
    // An op of no micro-batch that reads only variables and inputs (a
    // variable laid out for a backward matmul, say) is ready at the start:
    // ranked after the units it could hold back a unit that needs it, and
    // with it the unit's transfers, which the peer stage expects in unit
    // order. It goes first, with the hoisted ops.
    const bool reads_only_variables = preds[i].empty() && op.name != "send" && op.name != "recv";
    const size_t kind = p->weight[static_cast<size_t>(op.id)] ? 2 : op.backward ? 1 : 0;
    const int64_t slot =
        op.micro_batch >= 0 ? slot_of[3 * unit_of(p->ChunkOf(op.stage), op.micro_batch) + kind]
        : after_units && !reads_only_variables ? static_cast<int64_t>(3 * units)  // after every unit
                                               : -1;
    priority[i] = (slot + 1) * n + op.id;
  }
  const std::vector<int> order = ir::PriorityTopologicalOrder(preds, priority);
  TESSEL_CHECK_CODE(order.size() == mine.size(), StatusCode::kInternal)
      << "graph '" << graph.name() << "': this rank's ops depend on each other in a cycle";
  auto stream_of = [&](const ir::Op& op) {
    return p->exec.at(op.id).communicates ? Stream::kCommunication : Stream::kCompute;
  };
  for (int i : order) {
    const ir::Op& op = ops[static_cast<size_t>(mine[static_cast<size_t>(i)])];
    p->order[static_cast<int>(stream_of(op))].push_back(op.id);
  }
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
    for (int id : p->order[1]) {
      const ir::Op& op = ops[static_cast<size_t>(id)];
      VLOG(2) << "graph '" << graph.name() << "': communication " << id << " '" << op.name << "' micro-batch "
              << op.micro_batch << (op.backward ? " backward" : " forward");
    }
  }
  p->readers.assign(graph.values().size(), 0);
  p->keep.assign(graph.values().size(), 0);
  for (const auto& [name, id] : graph.outputs()) p->keep[static_cast<size_t>(id)] = 1;
  std::vector<char> off(graph.values().size(), 0);
  for (int id : mine) {
    const ir::Op& op = ops[static_cast<size_t>(id)];
    for (int in : op.inputs) {
      ++p->readers[static_cast<size_t>(in)];
      const int producer = graph.value(in).producer;
      if (producer < 0 || p->runs[static_cast<size_t>(producer)]) continue;
      // Only a transfer reads a value of another stage, for its layout.
      TESSEL_CHECK_CODE(GetOpDef(op.name).communicates && graph.value(in).is_global(), StatusCode::kInternal)
          << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' on stage " << op.stage
          << " reads %" << in << ", computed by op " << producer << " on stage " << ops[producer].stage;
      if (!off[static_cast<size_t>(in)]) p->off_rank.push_back(in);
      off[static_cast<size_t>(in)] = 1;
    }
  }
  for (const auto& [name, id] : graph.outputs()) {
    const int producer = graph.value(id).producer;
    if (producer >= 0 && !p->runs[static_cast<size_t>(producer)] && !off[static_cast<size_t>(id)]) {
      p->off_rank.push_back(id);
      off[static_cast<size_t>(id)] = 1;
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
      most = std::max(most,
                      MaxInFlight(StageActions(options_.schedule, p->stages, s, micro_batches, p->chunks)));
    p->send_quota = 2 * most;
  }
  VLOG(1) << "graph '" << graph.name() << "': rank " << rank << " runs " << mine.size() << " of "
          << ops.size() << " ops on stage " << p->stage << " of " << p->stages << " (" << p->order[0].size()
          << " compute, " << p->order[1].size() << " communication) in " << p->chunks << " chunk(s), "
          << options_.schedule << " over " << micro_batches << " micro-batches";
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
  std::vector<Tensor> env;
  std::vector<char> ready;
  std::vector<char> done;  // per op: finished (for Program::after)
  std::vector<int> readers_left;
  std::string error;  // the first failure; the streams stop at their next actor
  StatusCode error_code = StatusCode::kInternal;
  // Posted sends the completion thread waits for, in order; null: no more.
  std::deque<std::unique_ptr<PostedSends>> sends;
  int pending_sends = 0;  // posted and not yet taken by their receivers
  int max_pending_sends = 0;
  // Posted receives per completion queue (Program::receive_queue), each
  // with its actor's event, completed when the message has arrived.
  struct PendingReceive {
    int op = 0;
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

std::string Describe(const ir::Graph& graph, const ir::Op& op) {
  std::ostringstream os;
  os << "graph '" << graph.name() << "': op " << op.id << " '" << op.name << "' (stage " << op.stage;
  if (op.micro_batch >= 0) os << ", micro-batch " << op.micro_batch;
  os << ", " << (op.backward ? "backward" : "forward") << ") on rank " << CurrentRank();
  return os.str();
}

}  // namespace

ActorRuntime::Tensors ActorRuntime::Run(const ir::Graph& graph, const Tensors& inputs) {
  const Program& program = ProgramFor(graph);
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
  state.ready.assign(graph.values().size(), 0);
  for (const ir::Value& v : graph.values()) state.ready[v.id] = v.kind != ir::Value::Kind::kOpOutput;
  for (int v : program.off_rank) {
    state.env[static_cast<size_t>(v)] = OffRankValue(graph.value(v));
    state.ready[static_cast<size_t>(v)] = 1;
  }
  state.readers_left = program.readers;
  state.done.assign(ops.size(), 0);
  const std::chrono::milliseconds timeout =
      options_.input_timeout.count() > 0
          ? options_.input_timeout
          : (comm::IsWorldInitialized() ? comm::World().timeout() : std::chrono::milliseconds(300000));

  Allocator* allocator = GetAllocator(Device::CPU());
  const int64_t held_before = allocator->stats().allocated_bytes;
  allocator->ResetPeak();
  std::vector<ActorEvent> events[2];

  auto run_stream = [&](Stream stream) {
    const std::vector<int>& order = program.order[static_cast<int>(stream)];
    std::vector<ActorEvent>& log = events[static_cast<int>(stream)];
    log.reserve(order.size());
    std::vector<Tensor> args;  // reused: one allocation per stream, not per actor
    for (int id : order) {
      const ir::Op& op = ops[static_cast<size_t>(id)];
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
          if (state.done[static_cast<size_t>(before)]) continue;
          ++state.waiting;
          const bool finished = state.changed.wait_until(lock, deadline(), [&] {
            return state.done[static_cast<size_t>(before)] || !state.error.empty();
          });
          --state.waiting;
          if (!finished) {
            state.error = Describe(graph, op) + " waited " + std::to_string(timeout.count()) + " ms for op " +
                          std::to_string(before) + " '" + ops[static_cast<size_t>(before)].name +
                          "' (an in-place update ordered with it), which did not finish";
            state.error_code = StatusCode::kTimeout;
            state.changed.notify_all();
          }
          if (!state.error.empty()) return;
        }
        for (int in : op.inputs) {
          if (state.ready[in]) continue;
          ++state.waiting;
          const bool arrived = state.changed.wait_until(
              lock, deadline(), [&] { return state.ready[in] || !state.error.empty(); });
          --state.waiting;
          if (!arrived) {
            const int producer = graph.value(in).producer;
            state.error = Describe(graph, op) + " waited " + std::to_string(timeout.count()) + " ms for %" +
                          std::to_string(in) + " from op " + std::to_string(producer) + " '" +
                          ops[static_cast<size_t>(producer)].name + "', which did not run";
            state.error_code = StatusCode::kTimeout;
            state.changed.notify_all();
          }
          if (!state.error.empty()) return;
        }
        args.reserve(op.inputs.size());
        for (int in : op.inputs) args.push_back(state.env[static_cast<size_t>(in)]);
      }
      ActorEvent event{.op = id,
                       .stream = stream,
                       .micro_batch = op.micro_batch,
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
                       Describe(graph, op) + " waited " + std::to_string(timeout.count()) + " ms for the " +
                           std::to_string(program.send_quota) +
                           " earlier send(s) of this rank to be taken by their receivers");
            return;
          }
          // Posted, not waited for: the completion thread waits.
          auto posted = std::make_unique<PostedSends>();
          program.exec.Run(instruction, args, posted.get());
          std::lock_guard<std::mutex> lock(state.mu);
          state.sends.push_back(std::move(posted));
          state.max_pending_sends = std::max(state.max_pending_sends, ++state.pending_sends);
          state.posted_changed.notify_all();
        } else if (instruction.kind == plan::Instruction::Kind::kRecv) {
          // Posted, not waited for: its queue's completion worker waits and
          // fills the register, while this stream goes on.
          auto posted = std::make_unique<PostedReceive>(program.exec.PostReceive(instruction));
          std::lock_guard<std::mutex> lock(state.mu);
          state.receives[static_cast<size_t>(program.receive_queue[static_cast<size_t>(id)])].push_back(
              {id, std::move(posted), event});
          state.posted_changed.notify_all();
        } else {
          outs = program.exec.Run(instruction, args);
        }
      } catch (const Error& e) {
        state.Fail(e.code(), Describe(graph, op) + " failed: " + e.what());
        return;
      } catch (const std::exception& e) {
        state.Fail(StatusCode::kInternal, Describe(graph, op) + " failed: " + e.what());
        return;
      }
      args.clear();
      const bool completes_later = instruction.kind == plan::Instruction::Kind::kRecv;
      event.end_us = NowMicros();
      if (!completes_later) log.push_back(event);
      std::lock_guard<std::mutex> lock(state.mu);
      if (!completes_later) state.done[static_cast<size_t>(id)] = 1;
      for (size_t o = 0; o < outs.size(); ++o) {
        const size_t v = static_cast<size_t>(op.outputs[o]);
        if (program.readers[v] > 0 || program.keep[v]) state.env[v] = std::move(outs[o]);
        state.ready[v] = 1;
      }
      // A result is freed after this rank's last reader (named results stay).
      for (int in : op.inputs) {
        const size_t v = static_cast<size_t>(in);
        if (--state.readers_left[v] == 0 && !program.keep[v] &&
            graph.value(in).kind == ir::Value::Kind::kOpOutput)
          state.env[v] = Tensor();
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
      const ir::Op& op = ops[static_cast<size_t>(next.op)];
      Tensor received;
      try {
        received = next.posted->Wait();
      } catch (const Error& e) {
        state.Fail(e.code(), Describe(graph, op) + " failed: " + e.what());
        continue;  // the other receives still complete or time out on their own
      }
      next.posted.reset();
      next.event.end_us = NowMicros();
      log.push_back(next.event);
      std::lock_guard<std::mutex> lock(state.mu);
      state.done[static_cast<size_t>(next.op)] = 1;
      const size_t v = static_cast<size_t>(op.outputs.at(0));
      if (program.readers[v] > 0 || program.keep[v]) state.env[v] = std::move(received);
      state.ready[v] = 1;
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
  const bool communicates = !program.order[static_cast<int>(Stream::kCommunication)].empty();
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
    out << TimelineJson(graph);
    TESSEL_CHECK(out.good()) << "could not write the timeline to " << path;
  }

  Tensors results;
  for (const auto& [name, id] : graph.outputs())
    results[name] = program.exec.Global(id, state.env[static_cast<size_t>(id)]);
  return results;
}

std::string ActorRuntime::TimelineJson(const ir::Graph& graph) const {
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
