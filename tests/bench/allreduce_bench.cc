// All-reduce bandwidth of tessel's Gloo communicator. Run under
// tessel-launch; rank 0 prints one JSON line per size:
//   {"impl": "tessel", "bytes": N, "us": T, "algbw_gbps": .., "busbw_gbps": ..}
// algbw = bytes / time; busbw = algbw * 2(p-1)/p, the per-rank link traffic
// of a ring all-reduce (comparable across rank counts, as in nccl-tests).
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/comm/process_group.h"
#include "core/init.h"

DEFINE_int64(min_bytes, 1 << 10, "Smallest message size");
DEFINE_int64(max_bytes, 64 << 20, "Largest message size");
DEFINE_int32(step, 4, "Size multiplier between measurements");
DEFINE_double(seconds_per_size, 0.5, "Target time spent measuring each size");

using namespace tessel;

// The slowest rank's time counts: a collective is done when all are done.
double SlowestSeconds(comm::Communicator& world, std::chrono::steady_clock::duration elapsed) {
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count();
  world.AllReduce(&ns, 1, DType::kInt64, comm::ReduceOp::kMax);
  return static_cast<double>(ns) * 1e-9;
}

int main(int argc, char** argv) {
  InitProcess(&argc, &argv);  // core only: no interpreter needed
  auto& world = comm::World();
  const int p = world.size();
  for (int64_t bytes = FLAGS_min_bytes; bytes <= FLAGS_max_bytes; bytes *= FLAGS_step) {
    const int64_t n = bytes / 4;
    std::vector<float> buf(n, 1.0f);
    // Warm up, then pick an iteration count (the same on every rank).
    world.AllReduce(buf.data(), n, DType::kFloat32, comm::ReduceOp::kSum);
    world.Barrier();
    auto t0 = std::chrono::steady_clock::now();
    world.AllReduce(buf.data(), n, DType::kFloat32, comm::ReduceOp::kSum);
    double once = SlowestSeconds(world, std::chrono::steady_clock::now() - t0);
    int64_t iters =
        std::clamp<int64_t>(static_cast<int64_t>(FLAGS_seconds_per_size / std::max(once, 1e-6)), 3, 1000);

    world.Barrier();
    t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) world.AllReduce(buf.data(), n, DType::kFloat32, comm::ReduceOp::kSum);
    double secs = SlowestSeconds(world, std::chrono::steady_clock::now() - t0);
    double us = secs / iters * 1e6;
    double algbw = bytes / (us * 1e-6) / 1e9;
    if (world.rank() == 0) {
      std::printf(
          "{\"impl\": \"tessel\", \"ranks\": %d, \"bytes\": %lld, \"iters\": %lld, \"us\": %.2f, "
          "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}\n",
          p, static_cast<long long>(bytes), static_cast<long long>(iters), us, algbw,
          algbw * 2.0 * (p - 1) / p);
      std::fflush(stdout);
    }
  }
  return 0;
}
