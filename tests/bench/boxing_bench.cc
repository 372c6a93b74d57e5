// Boxing on 4 ranks: for P->B, S(0)->B, P->S(0) and S(0)->S(1) at each size,
// the bytes each rank actually wrote to its sockets (from /proc/self/io,
// which counts every write of the process, Gloo's threads included) next to
// the planner's prediction, and the time per conversion. Rank 0 prints one
// JSON line per case; tests/bench/boxing_vs_torch.py adds PyTorch's gloo.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/comm/process_group.h"
#include "graph/boxing_executor.h"
#include "graph/init.h"
#include "sbp/global_tensor.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_string(sizes_mib, "1,64", "Tensor sizes in MiB (f32, square-ish 2-D)");
DEFINE_double(seconds_per_case, 1.0, "Target time spent measuring each case");

using namespace tessel;

namespace {

int64_t BytesWritten() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "wchar:") return value;
  return -1;
}

int64_t MaxOverRanks(int64_t v) {
  comm::World().AllReduce(&v, 1, DType::kInt64, comm::ReduceOp::kMax);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Init(&argc, &argv);
  auto& world = comm::World();
  std::vector<int> ranks(world.size());
  for (int r = 0; r < world.size(); ++r) ranks[r] = r;
  const Placement line("cpu", ranks);
  struct Case {
    const char* name;
    Sbp from, to;
  };
  const Case cases[] = {
      {"P->B", P(), B()}, {"S(0)->B", S(0), B()}, {"P->S(0)", P(), S(0)}, {"S(0)->S(1)", S(0), S(1)}};
  std::stringstream sizes(FLAGS_sizes_mib);
  std::string mib;
  while (std::getline(sizes, mib, ',')) {
    // rows x cols f32 with rows*cols*4 = size; both divisible by the rank count.
    int64_t elements = std::stoll(mib) * (1 << 20) / 4, rows = 1;
    while (rows * rows < elements) rows *= 2;
    Shape shape{rows, elements / rows};
    for (const Case& c : cases) {
      Tensor x = rand(shape, line, {c.from}, 7);
      const std::shared_ptr<const BoxingPlan> plan_ref =
          GetBoxingPlan(line, {c.from}, line, {c.to}, shape, DType::kFloat32);
      const BoxingPlan& plan = *plan_ref;
      Tensor y = x.to_global(line, {c.to});  // warm-up: groups connect, buffers allocate
      world.Barrier();
      auto t0 = std::chrono::steady_clock::now();
      y = x.to_global(line, {c.to});
      double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      once = static_cast<double>(MaxOverRanks(static_cast<int64_t>(once * 1e9))) * 1e-9;
      int64_t iters =
          std::max<int64_t>(3, static_cast<int64_t>(FLAGS_seconds_per_case / std::max(once, 1e-6)));
      world.Barrier();
      int64_t w0 = BytesWritten();
      t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < iters; ++i) y = x.to_global(line, {c.to});
      int64_t ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      int64_t written = BytesWritten() - w0;
      ns = MaxOverRanks(ns);
      written = MaxOverRanks(written);
      if (world.rank() == 0) {
        std::printf(
            "{\"impl\": \"tessel\", \"case\": \"%s\", \"bytes\": %lld, \"iters\": %lld, \"us\": %.1f, "
            "\"sent_per_rank\": %.0f, \"predicted_per_rank\": %.0f, \"plan\": \"%s\"}\n",
            c.name, static_cast<long long>(shape.numel() * 4), static_cast<long long>(iters),
            static_cast<double>(ns) / iters / 1e3, static_cast<double>(written) / iters,
            plan.bytes_per_rank(), BoxingOpName(plan.steps.at(0).op));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
