#include "layers/parallel_mode.h"

#include <cstdlib>

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

// The integer q >= 2 with q^power == n, or 0.
int64_t ExactRoot(int64_t n, int power) {
  for (int64_t q = 2;; ++q) {
    int64_t p = 1;
    for (int i = 0; i < power; ++i) p *= q;
    if (p == n) return q;
    if (p > n) return 0;
  }
}

// A mode without options given one: a typo, or meant for another mode.
void CheckNoOptions(const char* mode, const ParallelModeSizes& s) {
  TESSEL_CHECK(s.options.empty()) << "tensor_parallel_mode '" << mode << "' takes no options; got '"
                                  << s.options.begin()->first << "'";
}

// 2.5d's depth option: a positive integer dividing tp.
int64_t Depth(const ParallelModeSizes& s) {
  for (const auto& [key, value] : s.options)
    TESSEL_CHECK(key == "depth") << "tensor_parallel_mode '2.5d' takes the option 'depth'; got '" << key
                                 << "'";
  const auto it = s.options.find("depth");
  TESSEL_CHECK(it != s.options.end())
      << "tensor_parallel_mode '2.5d' needs the option depth (tensor_parallel_mode_options { key: \"depth\" "
         "value: \"2\" }): tensor_parallel_size = depth x q x q";
  char* end = nullptr;
  const long long depth = std::strtoll(it->second.c_str(), &end, 10);
  TESSEL_CHECK(!it->second.empty() && *end == '\0' && depth >= 1)
      << "tensor_parallel_mode '2.5d': depth '" << it->second << "'; expected a positive integer";
  TESSEL_CHECK(s.tensor_parallel_size % depth == 0)
      << "tensor_parallel_mode '2.5d': depth " << depth << " does not divide tensor_parallel_size "
      << s.tensor_parallel_size << "; expected tensor_parallel_size = depth x q x q";
  return depth;
}

// tp = q^power with q >= 2, as {q, q, ...}; `what` the mode needs, for
// the error.
std::vector<int64_t> EqualSides(const char* mode, int64_t tp, int power, const char* what) {
  const int64_t q = ExactRoot(tp, power);
  TESSEL_CHECK(q > 0) << "tensor_parallel_mode '" << mode << "' needs " << what << "; got " << tp;
  return std::vector<int64_t>(static_cast<size_t>(power), q);
}

std::vector<int64_t> Mesh2d(const ParallelModeSizes& s) {
  CheckNoOptions("2d", s);
  return EqualSides("2d", s.tensor_parallel_size, 2,
                    "tensor_parallel_size = q x q with q >= 2 (4, 9, 16, ...)");
}

std::vector<int64_t> Mesh2p5d(const ParallelModeSizes& s) {
  const int64_t depth = Depth(s);
  TESSEL_CHECK(ExactRoot(s.tensor_parallel_size / depth, 2) > 0)
      << "tensor_parallel_mode '2.5d' needs tensor_parallel_size = depth x q x q with q >= 2; got "
      << s.tensor_parallel_size << " = depth " << depth << " x " << s.tensor_parallel_size / depth;
  std::vector<int64_t> mesh = {depth};
  for (int64_t side : EqualSides("2.5d", s.tensor_parallel_size / depth, 2, "")) mesh.push_back(side);
  return mesh;
}

std::vector<int64_t> Mesh3d(const ParallelModeSizes& s) {
  CheckNoOptions("3d", s);
  return EqualSides("3d", s.tensor_parallel_size, 3,
                    "tensor_parallel_size = q x q x q with q >= 2 (8, 27, 64, ...)");
}

NamedRegistry<ParallelMode>& Modes() {
  static NamedRegistry<ParallelMode> registry(
      "tensor_parallel_mode", "dist::RegisterParallelMode",
      {{"1d",
        {.check = [](const ParallelModeSizes& s) { CheckNoOptions("1d", s); },
         .stage_ranks = MegatronStageRanks,
         .layout = TensorLayout::k1d,
         .tensor_mesh = nullptr,
         .axes = nullptr}},
       // Each multi-axis mode's check is forming its mesh.
       {"2d",
        {.check = [](const ParallelModeSizes& s) { Mesh2d(s); },
         .stage_ranks = MegatronStageRanks,
         .layout = TensorLayout::k2d,
         .tensor_mesh = Mesh2d,
         .axes = nullptr}},
       {"2.5d",
        {.check = [](const ParallelModeSizes& s) { Mesh2p5d(s); },
         .stage_ranks = MegatronStageRanks,
         .layout = TensorLayout::k2p5d,
         .tensor_mesh = Mesh2p5d,
         .axes = nullptr}},
       {"3d",
        {.check = [](const ParallelModeSizes& s) { Mesh3d(s); },
         .stage_ranks = MegatronStageRanks,
         .layout = TensorLayout::k3d,
         .tensor_mesh = Mesh3d,
         .axes = nullptr}}});
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
