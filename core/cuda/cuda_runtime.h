// The CUDA backend's runtime pieces: device discovery, memory, copies and a
// Philox fill kernel. Compiled only when nvcc is found (TESSEL_HAS_CUDA).
#pragma once

#include <cstdint>

namespace tessel::cuda {

// Number of visible CUDA devices; 0 when there is no device or driver.
int DeviceCount();
// Waits for all work queued on the current device (profiling only: the
// kernels' ordering needs no host waits).
void Synchronize();
// out[i] = Philox(seed).Uniform(offset + i) computed on device `index`; the
// same values the CPU produces, so random init is device-invariant too.
void PhiloxUniform(float* device_out, int64_t n, uint64_t seed, uint64_t offset, int index);

}  // namespace tessel::cuda
