// Plan files (parallel/plan_file.h, protobuf text): any text must parse to a
// plan or throw tessel::Error; a parsed plan prints back to text that
// parses to the same plan.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "parallel/plan_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const tessel::parallel::ParallelPlan plan = tessel::parallel::ParsePlanText(text, "fuzz.plan");
    const std::string printed = tessel::parallel::PlanToText(plan);
    if (tessel::parallel::PlanToText(tessel::parallel::ParsePlanText(printed, "printed")) != printed)
      __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
