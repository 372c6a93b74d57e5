// Calling an op's kernel, as the eager interpreter and the executable plan
// both do: finding it for a device, checking an in-place op's inputs do not
// overlap, and the results an in-place op returns.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "ops/op_def.h"

namespace tessel {

// The op's kernel for `device`; throws naming the op and device if none.
const Kernel& KernelFor(const OpDef& op, DeviceType device);
// Runs `kernel`; a CPU kernel's error on an f16/bf16 input says why (the
// CPU kernels compute in f32).
std::vector<Tensor> RunKernel(const OpDef& op, DeviceType device, const Kernel& kernel,
                              const KernelContext& ctx);
// An in-place op must not write memory another of its inputs reads (AdamW
// with exp_avg and exp_avg_sq on one buffer would be silently wrong).
void CheckNoOverlap(const OpDef& op, const std::vector<Tensor>& locals);
// An in-place op's outputs: its updated inputs themselves. The kernel wrote
// into `written` (what it ran on); that must be the inputs' own storage.
std::vector<Tensor> MutatedInputs(const OpDef& op, const std::vector<Tensor>& inputs,
                                  const std::vector<Tensor>& written);

}  // namespace tessel
