// Times a GEMM callable and prints one JSON line, shared by tessel's
// benchmark and the OpenBLAS peer so both measure identically.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "tests/bench/gemm_shapes.h"

namespace tessel::bench {

// Runs gemm(a, b, c, shape) for every shape: two warm-up calls, then enough
// calls for ~`seconds`, reporting the best of three timed batches.
template <typename Gemm>
void TimeGemms(const char* impl, double seconds, Gemm gemm) {
  for (const GemmShape& s : kGemmShapes) {
    std::vector<float> a(s.m * s.k, 0.5f), b(s.k * s.n, 0.25f), c(s.m * s.n);
    gemm(a.data(), b.data(), c.data(), s);
    auto t0 = std::chrono::steady_clock::now();
    gemm(a.data(), b.data(), c.data(), s);
    double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int iters = std::max(1, static_cast<int>(seconds / 3 / std::max(once, 1e-6)));
    double best = 1e30;
    for (int batch = 0; batch < 3; ++batch) {
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) gemm(a.data(), b.data(), c.data(), s);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
    std::printf("{\"impl\": \"%s\", \"shape\": \"%s\", \"gflops\": %.1f}\n", impl, s.name,
                2.0 * s.m * s.n * s.k / best / 1e9);
    std::fflush(stdout);
  }
}

}  // namespace tessel::bench
