// Per-op time, for finding where a step goes: with TESSEL_PROFILE_OPS set,
// the eager interpreter and the executable plan time every op they run and
// print the totals to stderr at exit, slowest first.
//
//   TESSEL_PROFILE_OPS=1       host time per op (on a GPU: dispatch, and
//                              waits when the launch queue is full)
//   TESSEL_PROFILE_OPS=sync    waits for the GPU before and after each op:
//                              its GPU time plus its dispatch
//   TESSEL_PROFILE_OPS=events  CUDA events around each op, read once the
//                              GPU passed them: the step runs at its speed
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessel {

// Whether TESSEL_PROFILE_OPS is set (read once).
bool OpProfileEnabled();
// Runs `run` (the op `name` on `inputs`) and adds its time to the profile.
std::vector<Tensor> ProfileOp(const std::string& name, const std::vector<Tensor>& inputs,
                              const std::function<std::vector<Tensor>()>& run);

}  // namespace tessel
