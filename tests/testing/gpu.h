// For tests that need a GPU (CUDA builds only): without one they say
// "skipped: no CUDA device", and with TESSEL_REQUIRE_GPU=1 they fail
// instead, so a run on a GPU machine cannot pass by skipping.
//
//   if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/cuda/cuda_runtime.h"

namespace tessel::testing {

// True when no CUDA device is visible (a failure is recorded first when
// TESSEL_REQUIRE_GPU=1).
inline bool NoGpu() {
  if (cuda::DeviceCount() > 0) return false;
  const char* required = std::getenv("TESSEL_REQUIRE_GPU");
  if (required != nullptr && std::string(required) == "1")
    ADD_FAILURE() << "TESSEL_REQUIRE_GPU=1 but no CUDA device";
  return true;
}

}  // namespace tessel::testing
