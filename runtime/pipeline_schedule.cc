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

// Narayanan et al.'s interleaved 1F1B over `chunks` chunks per stage. The
// stage's i-th forward belongs to round i / p: chunk (i / p) mod v, and
// micro-batch p * (i / (p v)) + i mod p; its i-th backward likewise, from
// the last chunk down. Warm-up: 2 (p - s - 1) + (v - 1) p forwards (all of
// them when m = p: a round of p micro-batches is the whole batch), then one
// forward and one backward, then the remaining backwards.
std::vector<Action> Interleaved1F1B(int stages, int stage, int micro_batches, int chunks) {
  if (chunks == 1) return OneFOneB(stages, stage, micro_batches);
  TESSEL_CHECK(micro_batches % stages == 0)
      << "interleaved 1F1B over " << micro_batches << " micro-batches on " << stages
      << " stages: expected the micro-batches a multiple of the stage count (each stage runs its " << chunks
      << " chunks in rounds of " << stages << " micro-batches); use "
      << (micro_batches / stages > 0 ? std::to_string(micro_batches / stages * stages) + " or " : "")
      << (micro_batches / stages + 1) * stages;
  const int units = micro_batches * chunks;
  auto unit = [&](int i, bool backward) {
    const int round = i / stages, chunk = round % chunks;
    return Action{backward, round / chunks * stages + i % stages, false,
                  backward ? chunks - 1 - chunk : chunk};
  };
  const int warmup =
      micro_batches == stages ? units : std::min(units, 2 * (stages - stage - 1) + (chunks - 1) * stages);
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(2 * units));
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back(unit(next_forward, false));
  while (next_forward < units) {
    out.push_back(unit(next_forward++, false));
    out.push_back(unit(next_backward++, true));
  }
  while (next_backward < units) out.push_back(unit(next_backward++, true));
  return out;
}

// "in_order" is graph mode's reference executor, which tessel-train and
// train_gpt take before looking here.
constexpr const char* kInOrder = "in_order";

struct Schedule {
  ChunkedScheduleFunction order;
  bool chunked = false;  // takes more than one chunk per stage
};

Schedule OneChunk(ScheduleFunction order) {
  return {[order = std::move(order)](int stages, int stage, int m, int) { return order(stages, stage, m); },
          false};
}

NamedRegistry<Schedule>& Schedules() {
  static NamedRegistry<Schedule> registry("pipeline schedule", "runtime::RegisterSchedule",
                                          {{"1f1b", OneChunk(OneFOneB)},
                                           {"gpipe", OneChunk(GPipe)},
                                           {"naive", OneChunk(GPipe)},
                                           {"interleaved_1f1b", {Interleaved1F1B, true}},
                                           {"zb_h1", OneChunk(ZeroBubbleH1)}});
  return registry;
}

Schedule Find(const std::string& name) {
  return Schedules().Get(name, std::string("and ") + kInOrder + ", graph mode's reference executor");
}

std::string UnitText(const Action& a, bool chunked) {
  std::string out = std::string(1, a.weight     ? 'W'
                                   : a.backward ? 'B'
                                                : 'F')
                        .append(std::to_string(a.micro_batch));
  if (chunked) out.append("c").append(std::to_string(a.chunk));
  return out;
}

}  // namespace

namespace {
void Add(const std::string& name, bool given, Schedule schedule) {
  TESSEL_CHECK(given) << "RegisterSchedule('" << name << "'): no function given";
  TESSEL_CHECK(name != kInOrder) << "RegisterSchedule: '" << kInOrder
                                 << "' is reserved for graph mode's reference executor";
  Schedules().Add(name, std::move(schedule));
}
}  // namespace

void RegisterSchedule(const std::string& name, ScheduleFunction schedule) {
  const bool given = schedule != nullptr;
  Add(name, given, OneChunk(std::move(schedule)));
}

void RegisterSchedule(const std::string& name, ChunkedScheduleFunction schedule) {
  const bool given = schedule != nullptr;
  Add(name, given, {std::move(schedule), true});
}

std::vector<std::string> ScheduleNames() { return Schedules().Names(); }

std::string ParseSchedule(const std::string& name) {
  Find(name);
  return name == "naive" ? "gpipe" : name;
}

std::vector<Action> StageActions(const std::string& schedule, int stages, int stage, int micro_batches,
                                 int chunks) {
  TESSEL_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1 && chunks >= 1)
      << "pipeline schedule of stage " << stage << " of " << stages << " over " << micro_batches
      << " micro-batches and " << chunks
      << " chunk(s) per stage; expected 0 <= stage < stages, at least one micro-batch and one chunk";
  const Schedule found = Find(schedule);
  TESSEL_CHECK(found.chunked || chunks == 1)
      << "pipeline schedule '" << schedule << "' runs one model chunk per stage, and each stage holds "
      << chunks << " (virtual_pipeline_size " << chunks
      << "); expected interleaved_1f1b or a schedule registered with a (stages, stage, micro_batches, "
         "chunks) function";
  const std::vector<Action> out = found.order(stages, stage, micro_batches, chunks);
  const std::string wrong = ValidateActions(out, micro_batches, chunks);
  TESSEL_CHECK(wrong.empty())
      << "pipeline schedule '" << schedule << "' gives stage " << stage << " of " << stages << " over "
      << micro_batches << " micro-batches" << (chunks > 1 ? " and " + std::to_string(chunks) + " chunks" : "")
      << " the order [" << ActionsText(out) << "]: " << wrong
      << "; expected each micro-batch's F once, then its B once (then its W once, when "
         "the schedule lists W units)"
      << (chunks > 1 ? ", in every chunk" : "");
  return out;
}

std::string CheckSchedule(const std::string& schedule, int stages, int micro_batches, int chunks) {
  std::vector<std::vector<Action>> orders;
  for (int s = 0; s < stages; ++s) orders.push_back(StageActions(schedule, stages, s, micro_batches, chunks));
  const bool chunked = chunks > 1;
  const int virtual_stages = stages * chunks;
  auto name = [&](int virtual_stage) {
    return chunked ? "virtual stage " + std::to_string(virtual_stage) + " (stage " +
                         std::to_string(virtual_stage % stages) + " chunk " +
                         std::to_string(virtual_stage / stages) + ")"
                   : "stage " + std::to_string(virtual_stage);
  };
  // Adjacent virtual stages hand each other their transfers in unit order,
  // so they must agree on the order of their forwards (activations flow
  // down) and of their backwards (gradients flow up).
  auto micro_batch_order = [&](int virtual_stage, bool backward) {
    std::vector<int> out;
    for (const Action& a : orders[static_cast<size_t>(virtual_stage % stages)])
      if (a.chunk == virtual_stage / stages && a.backward == backward && !a.weight)
        out.push_back(a.micro_batch);
    return out;
  };
  for (int j = 0; j + 1 < virtual_stages; ++j)
    for (bool backward : {false, true}) {
      const std::vector<int> here = micro_batch_order(j, backward), next = micro_batch_order(j + 1, backward);
      if (here != next)
        return "pipeline schedule '" + schedule + "' runs the " + (backward ? "backwards" : "forwards") +
               " of " + name(j) + " in the order [" + Join(here, " ") + "] and those of " + name(j + 1) +
               " in [" + Join(next, " ") +
               "]; adjacent stages pass their micro-batches on in order, so they must agree";
    }
  const size_t m = static_cast<size_t>(micro_batches);
  std::vector<std::vector<char>> forward_done(static_cast<size_t>(virtual_stages), std::vector<char>(m, 0)),
      backward_done = forward_done;
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  auto virtual_of = [&](size_t s, const Action& a) { return a.chunk * stages + static_cast<int>(s); };
  // A unit is ready once what it receives was sent: the previous virtual
  // stage's forward, the next one's backward (the last one's backward
  // starts from its own forward, which ValidateActions already put first).
  auto ready = [&](size_t s, const Action& a) {
    const size_t k = static_cast<size_t>(a.micro_batch);
    const int j = virtual_of(s, a);
    if (a.weight) return true;  // after its own B (ValidateActions), nothing to receive
    if (!a.backward) return j == 0 || forward_done[static_cast<size_t>(j - 1)][k] != 0;
    return j + 1 == virtual_stages || backward_done[static_cast<size_t>(j + 1)][k] != 0;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t s = 0; s < orders.size(); ++s) {
      while (next[s] < orders[s].size() && ready(s, orders[s][next[s]])) {
        const Action& a = orders[s][next[s]++];
        if (!a.weight)
          (a.backward
               ? backward_done
               : forward_done)[static_cast<size_t>(virtual_of(s, a))][static_cast<size_t>(a.micro_batch)] = 1;
        moved = true;
      }
    }
  }
  std::ostringstream waits;
  for (size_t s = 0; s < orders.size(); ++s) {
    if (next[s] == orders[s].size()) continue;
    const Action& a = orders[s][next[s]];
    const int j = virtual_of(s, a), from = a.backward ? j + 1 : j - 1;
    Action awaited = a;
    awaited.chunk = from / stages;
    waits << (waits.tellp() > 0 ? "; " : "") << "stage " << s << " waits at " << UnitText(a, chunked)
          << " for stage " << from % stages << "'s " << UnitText(awaited, chunked);
  }
  if (waits.tellp() == 0) return "";
  return "pipeline schedule '" + schedule + "' deadlocks on " + std::to_string(stages) + " stages" +
         (chunked ? " of " + std::to_string(chunks) + " chunks" : "") + " over " +
         std::to_string(micro_batches) + " micro-batches: " + waits.str();
}

std::string ActionsText(const std::vector<Action>& actions) {
  const bool chunked =
      std::any_of(actions.begin(), actions.end(), [](const Action& a) { return a.chunk != 0; });
  std::ostringstream os;
  for (size_t i = 0; i < actions.size(); ++i) os << (i ? " " : "") << UnitText(actions[i], chunked);
  return os.str();
}

std::string ValidateActions(const std::vector<Action>& actions, int micro_batches, int chunks) {
  const bool chunked = chunks > 1;
  const size_t units = static_cast<size_t>(std::max(micro_batches, 0) * std::max(chunks, 0));
  std::vector<int> forwards(units, 0), backwards = forwards, weights = forwards;
  bool split = false;
  for (const Action& a : actions) {
    const std::string name = UnitText(a, chunked || a.chunk != 0);
    if (a.weight && !a.backward) return name + " is a weight-gradient unit that is not a backward";
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
      return name + " is beyond the " + std::to_string(micro_batches) + " micro-batches";
    if (a.chunk < 0 || a.chunk >= chunks)
      return name + " is beyond the " + std::to_string(chunks) + " chunk(s)";
    const size_t k = static_cast<size_t>(a.chunk * micro_batches + a.micro_batch);
    int& seen = a.weight ? weights[k] : a.backward ? backwards[k] : forwards[k];
    if (seen > 0) return name + " twice";
    Action forward = a, backward = a;
    forward.backward = forward.weight = false;
    backward.weight = false;
    if (a.backward && !a.weight && forwards[k] == 0) return name + " before " + UnitText(forward, chunked);
    if (a.weight && backwards[k] == 0) return name + " before " + UnitText(backward, chunked);
    seen = 1;
    split |= a.weight;
  }
  for (size_t k = 0; k < units; ++k) {
    const Action unit{false, static_cast<int>(k) % micro_batches, false, static_cast<int>(k) / micro_batches};
    Action backward = unit, weight = unit;
    backward.backward = weight.backward = weight.weight = true;
    if (forwards[k] == 0) return "no " + UnitText(unit, chunked);
    if (backwards[k] == 0) return "no " + UnitText(backward, chunked);
    if (split && weights[k] == 0)
      return "no " + UnitText(weight, chunked) + " (other micro-batches have W units)";
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
