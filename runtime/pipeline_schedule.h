// Pipeline schedules: the order in which one stage runs the forward (F) and
// backward (B) of each micro-batch. The actor runtime (runtime/actor_runtime.h)
// runs a rank's ops in this order; the same functions give the reference
// sequences tests compare a run's trace with.
//
// GPipe ("gpipe", also "naive"): every forward, then every backward. A stage
// holds the activations of all m micro-batches at once.
// 1F1B ("1f1b"): stage s of p runs min(p - s - 1, m) warm-up forwards, then
// alternates one forward and one backward, then the cool-down backwards.
// A stage holds at most min(p - s, m) micro-batches' activations.
// With fewer micro-batches than stages, the first stages' warm-up covers
// every micro-batch, so they run GPipe's order (the runtime logs this).
#pragma once

#include <string>
#include <vector>

namespace tessel::runtime {

enum class Schedule { kGPipe, kOneFOneB };

// "gpipe" / "naive" and "1f1b"; anything else throws naming the value and
// the choices.
Schedule ParseSchedule(const std::string& name);
const char* ScheduleName(Schedule schedule);

struct Action {
  bool backward = false;
  int micro_batch = 0;
  bool operator==(const Action& o) const { return backward == o.backward && micro_batch == o.micro_batch; }
};

// The reference order of stage `stage` of `stages` over `micro_batches`
// micro-batches. Throws on a stage out of range or counts below 1.
std::vector<Action> StageActions(Schedule schedule, int stages, int stage, int micro_batches);

// "F0 F1 B0 F2 B1 B2".
std::string ActionsText(const std::vector<Action>& actions);

// Checks a stage's action trace: each micro-batch 0..micro_batches-1 runs
// one forward and one backward, the forward first. Returns "" when it holds,
// else what is wrong ("B3 before F3", "F2 twice", "no B5").
std::string ValidateActions(const std::vector<Action>& actions, int micro_batches);

// The most micro-batches whose forward has run and backward not yet, over
// the trace: the activations the stage keeps at once.
int MaxInFlight(const std::vector<Action>& actions);

}  // namespace tessel::runtime
