#include "runtime/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tessel::runtime {

Schedule ParseSchedule(const std::string& name) {
  if (name == "gpipe" || name == "naive") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::kOneFOneB;
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "pipeline schedule '" << name << "' is unknown; expected gpipe (or naive) or 1f1b";
}

const char* ScheduleName(Schedule schedule) { return schedule == Schedule::kGPipe ? "gpipe" : "1f1b"; }

std::vector<Action> StageActions(Schedule schedule, int stages, int stage, int micro_batches) {
  TESSEL_CHECK(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1)
      << "pipeline schedule of stage " << stage << " of " << stages << " over " << micro_batches
      << " micro-batches; expected 0 <= stage < stages and at least one micro-batch";
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(2 * micro_batches));
  const int warmup =
      schedule == Schedule::kGPipe ? micro_batches : std::min(stages - stage - 1, micro_batches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) out.push_back({false, next_forward});
  // Steady state: one forward, one backward (the forward's stash grows by
  // one and the backward frees the oldest).
  while (next_forward < micro_batches) {
    out.push_back({false, next_forward++});
    out.push_back({true, next_backward++});
  }
  while (next_backward < micro_batches) out.push_back({true, next_backward++});
  return out;
}

std::string ActionsText(const std::vector<Action>& actions) {
  std::ostringstream os;
  for (size_t i = 0; i < actions.size(); ++i)
    os << (i ? " " : "") << (actions[i].backward ? 'B' : 'F') << actions[i].micro_batch;
  return os.str();
}

std::string ValidateActions(const std::vector<Action>& actions, int micro_batches) {
  std::vector<int> forwards(static_cast<size_t>(std::max(micro_batches, 0)), 0), backwards = forwards;
  for (const Action& a : actions) {
    const std::string name = std::string(a.backward ? "B" : "F").append(std::to_string(a.micro_batch));
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
      return name + " is beyond the " + std::to_string(micro_batches) + " micro-batches";
    const size_t k = static_cast<size_t>(a.micro_batch);
    int& seen = a.backward ? backwards[k] : forwards[k];
    if (seen > 0) return name + " twice";
    if (a.backward && forwards[k] == 0) return name + " before F" + std::to_string(k);
    seen = 1;
  }
  for (int k = 0; k < micro_batches; ++k) {
    if (forwards[static_cast<size_t>(k)] == 0) return "no F" + std::to_string(k);
    if (backwards[static_cast<size_t>(k)] == 0) return "no B" + std::to_string(k);
  }
  return "";
}

int MaxInFlight(const std::vector<Action>& actions) {
  int live = 0, most = 0;
  for (const Action& a : actions) {
    live += a.backward ? -1 : 1;
    most = std::max(most, live);
  }
  return most;
}

}  // namespace tessel::runtime
