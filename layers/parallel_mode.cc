#include "layers/parallel_mode.h"

#include <algorithm>
#include <cctype>
#include <mutex>

#include "core/error.h"
#include "core/join.h"

namespace tessel::dist {

namespace {

std::vector<std::vector<int>> MegatronStageRanks(const ParallelModeSizes& s) {
  const int64_t per_stage = s.data_parallel_size * s.tensor_parallel_size;
  std::vector<std::vector<int>> stages(static_cast<size_t>(s.pipeline_parallel_size));
  for (int64_t stage = 0; stage < s.pipeline_parallel_size; ++stage)
    for (int64_t r = 0; r < per_stage; ++r) stages[stage].push_back(static_cast<int>(stage * per_stage + r));
  return stages;
}

struct Registry {
  std::mutex mu;
  std::map<std::string, ParallelMode> modes = {{"1d", {.check = nullptr, .stage_ranks = MegatronStageRanks}}};
};

Registry& TheRegistry() {
  static Registry registry;
  return registry;
}

}  // namespace

void RegisterParallelMode(const std::string& name, ParallelMode mode) {
  TESSEL_CHECK(!name.empty() && std::all_of(name.begin(), name.end(),
                                            [](char c) {
                                              return std::isalnum(static_cast<unsigned char>(c)) ||
                                                     c == '_' || c == '-' || c == '.';
                                            }))
      << "RegisterParallelMode: name '" << name << "'; expected letters, digits, '_', '-' or '.'";
  TESSEL_CHECK(mode.stage_ranks != nullptr) << "RegisterParallelMode('" << name << "'): no stage_ranks given";
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  TESSEL_CHECK(r.modes.emplace(name, std::move(mode)).second)
      << "RegisterParallelMode: a parallel mode named '" << name << "' is already registered";
}

std::vector<std::string> ParallelModeNames() {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& entry : r.modes) names.push_back(entry.first);
  return names;
}

ParallelMode FindParallelMode(const std::string& name) {
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    const auto it = r.modes.find(name);
    if (it != r.modes.end()) return it->second;
  }
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "tensor_parallel_mode '" << name
      << "' is not registered; registered: " << Join(ParallelModeNames(), ", ")
      << " (a program adds its own with dist::RegisterParallelMode)";
}

}  // namespace tessel::dist
