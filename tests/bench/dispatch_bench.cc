// Eager dispatch overhead: the time per functional op on tiny tensors (4
// elements), where the kernel is negligible and what is measured is
// dispatch: signature lookup, boxing check, kernel call, autograd off. Local
// tensors and global tensors (B on a placement of this process alone, so no
// communication) are timed; rank 0 prints one JSON line per case.
//   tessel-launch --nproc_per_node 1 -- dispatch_bench
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <chrono>
#include <cstdio>

#include "graph/autograd.h"

DEFINE_int64(iterations, 200000, "ops per case");

using namespace tessel;

namespace {
template <typename Fn>
double MicrosPerOp(Fn&& fn) {
  for (int i = 0; i < 1000; ++i) fn();  // warm caches
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < FLAGS_iterations; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(FLAGS_iterations);
}
}  // namespace

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  NoGradGuard no_grad;
  const Placement self(DeviceType::kCPU, {CurrentRank()});
  Tensor a = full({4}, 1.0), b = full({4}, 2.0);
  Tensor ga = full({4}, 1.0, self, {B()}), gb = full({4}, 2.0, self, {B()});
  const double local_add = MicrosPerOp([&] { (void)fn::add(a, b); });
  const double global_add = MicrosPerOp([&] { (void)fn::add(ga, gb); });
  const double global_scale = MicrosPerOp([&] { (void)fn::mul_scalar(ga, 0.5); });
  if (CurrentRank() == 0) {
    std::printf("{\"case\": \"local add [4]\", \"us\": %.3f}\n", local_add);
    std::printf("{\"case\": \"global add [4] B\", \"us\": %.3f}\n", global_add);
    std::printf("{\"case\": \"global mul_scalar [4] B\", \"us\": %.3f}\n", global_scale);
  }
  return 0;
}
