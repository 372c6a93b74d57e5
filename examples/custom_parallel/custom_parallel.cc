// custom_parallel: tessel's training program with three extensions of this
// project's own, each registered by name and chosen in the config
// (gpt2_custom_parallel.prototxt; docs/extending.md walks through it):
//
// - parallel mode "pp_inner": the pipeline stage is the fastest-varying
//   index over the ranks, so consecutive ranks (one machine's devices)
//   hold different stages and a stage's tensor-parallel group is strided
//   across machines. (tessel's "1d" does the opposite: stages are
//   contiguous blocks, tp innermost.) It adds an axis, "machine": the
//   consecutive ranks of each machine (the mode's option
//   ranks_per_machine, 2 by default), so code can ask
//   dist::AxisRank("machine") for a rank's device on its machine.
// - gradient handler "freeze": parameters whose name starts with the option
//   `prefix` get a zero gradient, so (without weight decay) they keep their
//   initial values while the rest trains.
// - pipeline schedule "gpipe_lifo": GPipe's forwards, then the backwards
//   from the newest micro-batch to the oldest, so the last activations
//   stashed are the first consumed.
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "layers/dist.h"
#include "layers/gradient_handler.h"
#include "layers/parallel_mode.h"
#include "ops/functional.h"
#include "runtime/pipeline_schedule.h"
#include "tools/train/training_program.h"

namespace {

using namespace tessel;

// rank = ((d * tp) + t) * pp + stage.
std::vector<std::vector<int>> StageInnermost(const dist::ParallelModeSizes& s) {
  std::vector<std::vector<int>> stages(static_cast<size_t>(s.pipeline_parallel_size));
  for (int64_t stage = 0; stage < s.pipeline_parallel_size; ++stage)
    for (int64_t d = 0; d < s.data_parallel_size; ++d)
      for (int64_t t = 0; t < s.tensor_parallel_size; ++t)
        stages[stage].push_back(
            static_cast<int>((d * s.tensor_parallel_size + t) * s.pipeline_parallel_size + stage));
  return stages;
}

std::vector<dist::NamedAxis> Machines(const dist::ParallelModeSizes& s) {
  int64_t per_machine = 2;
  for (const auto& [key, value] : s.options) {
    TESSEL_CHECK(key == "ranks_per_machine")
        << "pp_inner: option '" << key << "'; the options are: ranks_per_machine";
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), per_machine);
    TESSEL_CHECK(error == std::errc() && end == value.data() + value.size())
        << "pp_inner: ranks_per_machine is '" << value << "'; expected a whole number";
  }
  TESSEL_CHECK(per_machine >= 1 && s.world_size % per_machine == 0)
      << "pp_inner: ranks_per_machine " << per_machine << " does not divide the world of " << s.world_size;
  dist::NamedAxis machines{.name = "machine", .groups = {}};
  for (int64_t first = 0; first < s.world_size; first += per_machine) {
    std::vector<int>& machine = machines.groups.emplace_back();
    for (int64_t r = first; r < first + per_machine; ++r) machine.push_back(static_cast<int>(r));
  }
  return {machines};
}

optim::GradientHandler Freeze(const optim::HandlerOptions& options) {
  const auto prefix = options.find("prefix");
  TESSEL_CHECK(prefix != options.end() && !prefix->second.empty())
      << "gradient handler 'freeze' needs option 'prefix' (the start of the parameter names to freeze)";
  return [prefix = prefix->second, announced = false](const optim::NamedParams& params) mutable {
    std::vector<std::string> frozen;
    for (auto& [name, p] : params) {
      if (name.rfind(prefix, 0) != 0 || !p->grad().defined()) continue;
      p->set_grad(fn::mul_scalar(p->grad(), 0.0));
      frozen.push_back(name);
    }
    TESSEL_CHECK(!frozen.empty() || params.empty())
        << "gradient handler 'freeze': no parameter name starts with '" << prefix << "'";
    // Once (graph mode traces the step once; eagerly it runs every step).
    if (!announced && dist::Rank() == 0) {
      std::printf("freeze: %zu parameters frozen (prefix '%s')\n", frozen.size(), prefix.c_str());
      std::fflush(stdout);
    }
    announced = true;
  };
}

std::vector<runtime::Action> GPipeLifo(int, int, int micro_batches) {
  std::vector<runtime::Action> order;
  for (int k = 0; k < micro_batches; ++k) order.push_back({false, k});
  for (int k = micro_batches - 1; k >= 0; --k) order.push_back({true, k});
  return order;
}

}  // namespace

int main(int argc, char** argv) {
  dist::RegisterParallelMode("pp_inner", {.check = nullptr, .stage_ranks = StageInnermost, .axes = Machines});
  optim::RegisterGradientHandler("freeze", Freeze);
  runtime::RegisterSchedule("gpipe_lifo", GPipeLifo);
  return train::RunTrainingProgram(argc, argv);
}
