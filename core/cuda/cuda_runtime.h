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

// Profiling without waiting: an event recorded now in device `index`'s work
// queue (the stream every kernel runs on), taken from that device's pool;
// the thread's current device is left as it was. EventDone asks, without
// waiting, whether the queue has passed it; ElapsedMs gives the GPU time
// between two events of one device (waiting for the later) and returns
// both to the pool, or -1 when CUDA cannot tell (at exit, once the runtime
// is being unloaded; the events are then destroyed). DropEvent destroys an
// event that will not be read.
void* RecordEvent(int index);
bool EventDone(void* event);
float ElapsedMs(void* start, void* end);
void DropEvent(void* event);
// out[i] = Philox(seed).Uniform(offset + i) computed on device `index`; the
// same values the CPU produces, so random init is device-invariant too.
void PhiloxUniform(float* device_out, int64_t n, uint64_t seed, uint64_t offset, int index);

}  // namespace tessel::cuda
