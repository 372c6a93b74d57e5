#include "runtime/rank_schedule.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/join.h"
#include "graph/passes/passes.h"
#include "graph/passes/step_runs.h"

namespace tessel::runtime {

RankSchedule ScheduleRank(const ir::Graph& graph, int rank, const std::string& schedule) {
  RankSchedule s;
  const std::vector<ir::Op>& ops = graph.ops();
  const bool has_units = graph.micro_batch_units() > 1;
  // This rank's stage: the one whose ops compute on (or, for sends, read
  // from) a placement holding it; under an interleaved pipeline, the
  // virtual stages it holds, one per model chunk.
  int virtual_stages = 0, micro_batches = 1;
  const std::set<int> mine_stages = passes::StagesHeldBy(graph, rank);
  for (const ir::Op& op : ops) {
    micro_batches = std::max(micro_batches, op.micro_batch + 1);
    if (op.stage >= 0) virtual_stages = std::max(virtual_stages, op.stage + 1);
  }
  if (has_units) micro_batches = graph.micro_batch_units();
  s.chunks = std::max<int>(static_cast<int>(mine_stages.size()), 1);
  s.stages = std::max(virtual_stages / s.chunks, 1);
  // A rank on no stage of a pipeline runs the local ops only (stage -1).
  s.stage = !mine_stages.empty() ? *mine_stages.begin() : virtual_stages == 0 ? 0 : -1;
  int expected = s.stage;
  for (int held : mine_stages) {
    TESSEL_CHECK_CODE(held == expected && virtual_stages % s.chunks == 0, StatusCode::kInternal)
        << "graph '" << graph.name() << "': rank " << rank << " computes on stages {"
        << Join(std::vector<int>(mine_stages.begin(), mine_stages.end())) << "} of " << virtual_stages
        << "; expected one stage, or one virtual stage in each of its chunks (" << s.stage << ", "
        << s.stage + s.stages << ", ...)";
    expected += s.stages;
  }
  s.micro_batches = micro_batches;
  // Every rank checks the whole pipeline's orders, so a schedule whose
  // stages disagree or would wait on each other fails on every rank before
  // a step runs.
  const std::string wrong = CheckSchedule(schedule, s.stages, micro_batches, s.chunks);
  TESSEL_CHECK(wrong.empty()) << "graph '" << graph.name() << "': " << wrong;

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
  const size_t units = static_cast<size_t>(micro_batches * s.chunks);
  auto unit_of = [&](int chunk, int micro_batch) {
    return static_cast<size_t>(chunk * micro_batches + micro_batch);
  };
  std::vector<int64_t> slot_of(3 * units, 0);
  int first_micro_batch_op = static_cast<int>(ops.size());
  for (const ir::Op& op : ops)
    if (op.micro_batch >= 0) first_micro_batch_op = std::min(first_micro_batch_op, op.id);
  // Ops of the step that run after the units (those before run first, in
  // program order, as the in-order executor runs them).
  auto after_units = [&](const ir::Op& op) {
    return op.micro_batch < 0 &&
           (has_units ? s.exec.runs().after_units(op.id) : op.id > first_micro_batch_op);
  };
  bool& split_backward = s.split_backward;
  if (s.stage >= 0) {
    s.actions = StageActions(schedule, s.stages, s.stage, micro_batches, s.chunks);
    const std::vector<Action>& actions = s.actions;
    for (size_t i = 0; i < actions.size(); ++i) {
      const size_t u = unit_of(actions[i].chunk, actions[i].micro_batch);
      slot_of[3 * u + (actions[i].weight ? 2 : actions[i].backward ? 1 : 0)] = static_cast<int64_t>(i);
      split_backward |= actions[i].weight;
    }
    if (!split_backward)
      for (size_t u = 0; u < units; ++u) slot_of[3 * u + 2] = slot_of[3 * u + 1];
  }
  s.runs.assign(ops.size(), 0);
  for (const ir::Op& op : ops)
    s.runs[op.id] = op.stage < 0 || (s.stage >= 0 && op.stage % s.stages == s.stage);
  s.exec = plan::ExecPlan::Lower(graph, rank, &s.runs);
  const passes::StepRuns& step_runs = s.exec.runs();

  const std::vector<std::vector<int>> all_preds = ir::Predecessors(graph);
  std::vector<int>& mine = s.mine;
  for (const ir::Op& op : ops)
    if (s.runs[op.id]) mine.push_back(op.id);
  std::vector<int> index_of(ops.size(), -1);
  for (size_t i = 0; i < mine.size(); ++i) index_of[static_cast<size_t>(mine[i])] = static_cast<int>(i);
  std::vector<std::vector<int>>& preds = s.preds;
  preds.assign(mine.size(), {});
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
  s.weight.assign(ops.size(), 0);
  if (split_backward) {
    std::vector<char> feeds_send(mine.size(), 0);
    std::vector<size_t> stack;
    for (size_t i = 0; i < mine.size(); ++i) {
      const ir::Op& op = ops[static_cast<size_t>(mine[i])];
      if (op.kind == ir::OpKind::kSend && op.backward && op.micro_batch >= 0) stack.push_back(i);
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
      s.weight[static_cast<size_t>(op.id)] = op.backward && op.micro_batch >= 0 && !feeds_send[i];
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
      feeds_communication[static_cast<size_t>(pred)] |= s.exec.at(mine[i]).communicates;
      unit_needs[static_cast<size_t>(pred)] |= unit || unit_needs[i];
    }
  }
  // The runs: entry i of `mine` has RunsOf(op) of them from run_base[i].
  std::vector<int> run_base(mine.size() + 1, 0);
  for (size_t i = 0; i < mine.size(); ++i) run_base[i + 1] = run_base[i] + step_runs.RunsOf(mine[i]);
  const size_t num_runs = static_cast<size_t>(run_base.back());
  // Each run's predecessors, in one array: run r's from pred_begin[r].
  std::vector<int> pred_begin(num_runs + 1, 0), run_preds;
  std::vector<int64_t> priority(num_runs);
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::Op& op = ops[static_cast<size_t>(mine[i])];
    const bool unit = step_runs.unit(op.id);
    const int count = step_runs.RunsOf(op.id);
    for (int k = 0; k < count; ++k) {
      for (int pred : preds[i]) {
        const int before_op = mine[static_cast<size_t>(pred)];
        run_preds.push_back(run_base[static_cast<size_t>(pred)] +
                            (step_runs.unit(before_op) ? (unit ? k : step_runs.micro_batches() - 1) : 0));
      }
      // A running sum adds to the sum so far.
      if (step_runs.sum(op.id) && k > 0) run_preds.push_back(run_base[i] + k - 1);
      pred_begin[static_cast<size_t>(run_base[i] + k) + 1] = static_cast<int>(run_preds.size());
    }
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    const ir::Op& op = ops[static_cast<size_t>(mine[i])];
    const bool after = after_units(op);
    bool waits_for_communication = false;  // ranked early, it would stall its stream on the other
    for (int pred : preds[i])
      waits_for_communication |= s.exec.at(mine[static_cast<size_t>(pred)]).communicates;
    const bool early = s.exec.at(mine[i]).communicates || feeds_communication[i] || unit_needs[i];
    const size_t first = static_cast<size_t>(run_base[i]);
    if (after && !preds[i].empty() && !waits_for_communication && early && op.kind != ir::OpKind::kSend &&
        op.kind != ir::OpKind::kRecv) {
      priority[first] = 0;  // with its latest input (preds come first in program order)
      for (int k = pred_begin[first]; k < pred_begin[first + 1]; ++k)
        priority[first] =
            std::max(priority[first], priority[static_cast<size_t>(run_preds[static_cast<size_t>(k)])]);
      continue;
    }
    // An op of no micro-batch that reads only variables and inputs (a
    // variable laid out for a backward matmul, say) is ready at the start:
    // ranked after the units it could hold back a unit that needs it, and
    // with it the unit's transfers, which the peer stage expects in unit
    // order. It goes first, with the hoisted ops.
    const bool reads_only_variables =
        preds[i].empty() && op.kind != ir::OpKind::kSend && op.kind != ir::OpKind::kRecv;
    const size_t kind = s.weight[static_cast<size_t>(op.id)] ? 2 : op.backward ? 1 : 0;
    for (int k = 0; k < step_runs.RunsOf(op.id); ++k) {
      const int micro_batch = step_runs.unit(op.id) ? k : op.micro_batch;
      const int64_t slot = micro_batch >= 0 ? slot_of[3 * unit_of(s.ChunkOf(op.stage), micro_batch) + kind]
                           : after && !reads_only_variables
                               ? static_cast<int64_t>(3 * units)  // after every unit
                               : -1;
      priority[first + static_cast<size_t>(k)] = (slot + 1) * n + op.id;
    }
  }
  const std::vector<int> order = ir::PriorityTopologicalOrder(pred_begin, run_preds, priority);
  TESSEL_CHECK_CODE(order.size() == num_runs, StatusCode::kInternal)
      << "graph '" << graph.name() << "': this rank's ops depend on each other in a cycle";
  s.order.reserve(order.size());
  for (int r : order) {
    const size_t i =
        static_cast<size_t>(std::upper_bound(run_base.begin(), run_base.end(), r) - run_base.begin() - 1);
    const int op = mine[i];
    s.order.push_back({op, step_runs.unit(op) ? r - run_base[i] : ops[static_cast<size_t>(op)].micro_batch});
  }
  return s;
}

}  // namespace tessel::runtime
