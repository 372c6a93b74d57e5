#include "runtime/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/named_registry.h"

namespace tessel::runtime {

namespace {

// GPipe's and 1F1B's orders: `warmup` forwards, then one forward and one
// backward (the forward's stash grows by one and the backward frees the
// oldest), then the remaining backwards.
std::vector<Action> WarmupThenAlternate(int warmup, int micro_batches) {
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(2 * micro_batches));
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back({false, next_forward});
  while (next_forward < micro_batches) {
    out.push_back({false, next_forward++});
    out.push_back({true, next_backward++});
  }
  while (next_backward < micro_batches) out.push_back({true, next_backward++});
  return out;
}

std::vector<Action> GPipe(int, int, int micro_batches) {
  return WarmupThenAlternate(micro_batches, micro_batches);
}

std::vector<Action> OneFOneB(int stages, int stage, int micro_batches) {
  return WarmupThenAlternate(std::min(stages - stage - 1, micro_batches), micro_batches);
}

// Qi et al.'s ZB-H1: 1F1B's order of forwards and backwards, each backward
// B computing only the input gradients, and stage s running the weight
// gradients W of micro-batch k right after B of k + s (the last s at the
// end). The later a stage, the longer it waits in 1F1B's cool-down for the
// gradients coming back; its deferred W units fill that wait, and with F,
// B and W of one cost each the step takes 3m + p - 1 units instead of
// 1F1B's 3(m + p - 1). Stage s holds at most p micro-batches (forward run,
// W not yet): 1F1B's p - s, and s whose W waits.
std::vector<Action> ZeroBubbleH1(int stages, int stage, int micro_batches) {
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(3 * micro_batches));
  for (const Action& a : OneFOneB(stages, stage, micro_batches)) {
    out.push_back(a);
    if (a.backward && a.micro_batch - stage >= 0) out.push_back({true, a.micro_batch - stage, true});
  }
  for (int k = std::max(0, micro_batches - stage); k < micro_batches; ++k) out.push_back({true, k, true});
  return out;
}

// "in_order" is graph mode's reference executor, which tessel-train and
// train_gpt take before looking here.
constexpr const char* kInOrder = "in_order";

NamedRegistry<ScheduleFunction>& Schedules() {
  static NamedRegistry<ScheduleFunction> registry(
      "pipeline schedule", "runtime::RegisterSchedule",
      {{"1f1b", OneFOneB}, {"gpipe", GPipe}, {"naive", GPipe}, {"zb_h1", ZeroBubbleH1}});
  return registry;
}

ScheduleFunction Find(const std::string& name) {
  return Schedules().Get(name, std::string("and ") + kInOrder + ", graph mode's reference executor");
}

}  // namespace

void RegisterSchedule(const std::string& name, ScheduleFunction schedule) {
  TESSEL_CHECK(name != kInOrder) << "RegisterSchedule: '" << kInOrder
                                 << "' is reserved for graph mode's reference executor";
  TESSEL_CHECK(schedule != nullptr) << "RegisterSchedule('" << name << "'): no function given";
  Schedules().Add(name, std::move(schedule));
}

std::vector<std::string> ScheduleNames() { return Schedules().Names(); }

std::string ParseSchedule(const std::string& name) {
  Find(name);
  return name == "naive" ? "gpipe" : name;
}

std::vector<Action> StageActions(const std::string& schedule, int stages, int stage, int micro_batches) {
  TESSEL_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1)
      << "pipeline schedule of stage " << stage << " of " << stages << " over " << micro_batches
      << " micro-batches; expected 0 <= stage < stages and at least one micro-batch";
  const std::vector<Action> out = Find(schedule)(stages, stage, micro_batches);
  const std::string wrong = ValidateActions(out, micro_batches);
  TESSEL_CHECK(wrong.empty())
      << "pipeline schedule '" << schedule << "' gives stage " << stage << " of " << stages << " over "
      << micro_batches << " micro-batches the order [" << ActionsText(out) << "]: " << wrong
      << "; expected each micro-batch's F once, then its B once (then its W once, when "
         "the schedule lists W units)";
  return out;
}

std::string CheckSchedule(const std::string& schedule, int stages, int micro_batches) {
  std::vector<std::vector<Action>> orders;
  for (int s = 0; s < stages; ++s) orders.push_back(StageActions(schedule, stages, s, micro_batches));
  // Adjacent stages hand each other their transfers in unit order (a
  // receive takes the next message from its peer), so they must agree on
  // the order of their forwards (activations flow down) and of their
  // backwards (gradients flow up).
  auto micro_batch_order = [](const std::vector<Action>& order, bool backward) {
    std::vector<int> out;
    for (const Action& a : order)
      if (a.backward == backward && !a.weight) out.push_back(a.micro_batch);
    return out;
  };
  for (size_t s = 0; s + 1 < orders.size(); ++s)
    for (bool backward : {false, true}) {
      const std::vector<int> here = micro_batch_order(orders[s], backward),
                             next = micro_batch_order(orders[s + 1], backward);
      if (here != next)
        return "pipeline schedule '" + schedule + "' runs the " + (backward ? "backwards" : "forwards") +
               " of stage " + std::to_string(s) + " in the order [" + Join(here, " ") +
               "] and those of stage " + std::to_string(s + 1) + " in [" + Join(next, " ") +
               "]; adjacent stages pass their micro-batches on in order, so they must agree";
    }
  const size_t m = static_cast<size_t>(micro_batches);
  std::vector<std::vector<char>> forward_done(static_cast<size_t>(stages), std::vector<char>(m, 0)),
      backward_done = forward_done;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  // A unit is ready once what it receives was sent: the previous stage's
  // forward, the next stage's backward (the last stage's backward starts
  // from its own forward, which ValidateActions already put first).
  auto ready = [&](size_t s, const Action& a) {
    const size_t k = static_cast<size_t>(a.micro_batch);
    if (a.weight) return true;  // after its own B (ValidateActions), nothing to receive
    if (!a.backward) return s == 0 || forward_done[s - 1][k] != 0;
    return s + 1 == static_cast<size_t>(stages) || backward_done[s + 1][k] != 0;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t s = 0; s < orders.size(); ++s) {
      while (next[s] < orders[s].size() && ready(s, orders[s][next[s]])) {
        const Action& a = orders[s][next[s]++];
        if (!a.weight) (a.backward ? backward_done : forward_done)[s][static_cast<size_t>(a.micro_batch)] = 1;
        moved = true;
      }
    }
  }
  std::ostringstream waits;
  for (size_t s = 0; s < orders.size(); ++s) {
    if (next[s] == orders[s].size()) continue;
    const Action& a = orders[s][next[s]];
    waits << (waits.tellp() > 0 ? "; " : "") << "stage " << s << " waits at " << (a.backward ? 'B' : 'F')
          << a.micro_batch << " for stage " << (a.backward ? s + 1 : s - 1) << "'s "
          << (a.backward ? 'B' : 'F') << a.micro_batch;
  }
  if (waits.tellp() == 0) return "";
  return "pipeline schedule '" + schedule + "' deadlocks on " + std::to_string(stages) + " stages over " +
         std::to_string(micro_batches) + " micro-batches: " + waits.str();
}

namespace {
char Letter(const Action& a) { return a.weight ? 'W' : a.backward ? 'B' : 'F'; }
}  // namespace

std::string ActionsText(const std::vector<Action>& actions) {
  std::ostringstream os;
  for (size_t i = 0; i < actions.size(); ++i)
    os << (i ? " " : "") << Letter(actions[i]) << actions[i].micro_batch;
  return os.str();
}

std::string ValidateActions(const std::vector<Action>& actions, int micro_batches) {
  std::vector<int> forwards(static_cast<size_t>(std::max(micro_batches, 0)), 0), backwards = forwards,
                                                                                 weights = forwards;
  bool split = false;
  for (const Action& a : actions) {
    const std::string name = std::string(1, Letter(a)).append(std::to_string(a.micro_batch));
    if (a.weight && !a.backward) return name + " is a weight-gradient unit that is not a backward";
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
      return name + " is beyond the " + std::to_string(micro_batches) + " micro-batches";
    const size_t k = static_cast<size_t>(a.micro_batch);
    int& seen = a.weight ? weights[k] : a.backward ? backwards[k] : forwards[k];
    if (seen > 0) return name + " twice";
    if (a.backward && !a.weight && forwards[k] == 0) return name + " before F" + std::to_string(k);
    if (a.weight && backwards[k] == 0) return name + " before B" + std::to_string(k);
    seen = 1;
    split |= a.weight;
  }
  for (int k = 0; k < micro_batches; ++k) {
    if (forwards[static_cast<size_t>(k)] == 0) return "no F" + std::to_string(k);
    if (backwards[static_cast<size_t>(k)] == 0) return "no B" + std::to_string(k);
    if (split && weights[static_cast<size_t>(k)] == 0)
      return "no W" + std::to_string(k) + " (other micro-batches have W units)";
  }
  return "";
}

int MaxInFlight(const std::vector<Action>& actions) {
  bool split = false;
  for (const Action& a : actions) split |= a.weight;
  int live = 0, most = 0;
  for (const Action& a : actions) {
    if (!a.backward)
      ++live;
    else if (a.weight || !split)
      --live;  // the activations go with the unit that reads them last
    most = std::max(most, live);
  }
  return most;
}

}  // namespace tessel::runtime
