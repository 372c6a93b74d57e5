#include "layers/parallel_mode.h"

#include "core/error.h"
#include "core/named_registry.h"

namespace tessel::dist {

namespace {

std::vector<std::vector<int>> MegatronStageRanks(const ParallelModeSizes& s) {
  const int64_t per_stage = s.data_parallel_size * s.tensor_parallel_size;
  std::vector<std::vector<int>> stages(static_cast<size_t>(s.pipeline_parallel_size));
  for (int64_t stage = 0; stage < s.pipeline_parallel_size; ++stage)
    for (int64_t r = 0; r < per_stage; ++r) stages[stage].push_back(static_cast<int>(stage * per_stage + r));
  return stages;
}

// Megatron's arrangement takes no options: one given is a typo or meant for
// another mode.
void CheckMegatron(const ParallelModeSizes& s) {
  TESSEL_CHECK(s.options.empty()) << "tensor_parallel_mode '1d' takes no options; got '"
                                  << s.options.begin()->first << "'";
}

NamedRegistry<ParallelMode>& Modes() {
  static NamedRegistry<ParallelMode> registry(
      "tensor_parallel_mode", "dist::RegisterParallelMode",
      {{"1d", {.check = CheckMegatron, .stage_ranks = MegatronStageRanks}}});
  return registry;
}

}  // namespace

void RegisterParallelMode(const std::string& name, ParallelMode mode) {
  TESSEL_CHECK(mode.stage_ranks != nullptr) << "RegisterParallelMode('" << name << "'): no stage_ranks given";
  Modes().Add(name, std::move(mode));
}

std::vector<std::string> ParallelModeNames() { return Modes().Names(); }

ParallelMode FindParallelMode(const std::string& name) { return Modes().Get(name); }

}  // namespace tessel::dist
