// tessel's CPU GEMM (oneDNN, no environment variables) on the shapes of
// gemm_shapes.h. tests/bench/matmul_vs_peers.py runs it beside tuned
// OpenBLAS and PyTorch.
#include <cstdlib>

#include "ops/cpu/gemm.h"
#include "tests/bench/gemm_timer.h"

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  tessel::bench::TimeGemms(
      "tessel", seconds, [](const float* a, const float* b, float* c, const tessel::bench::GemmShape& s) {
        tessel::cpu::Gemm(false, false, s.m, s.n, s.k, 1.0f, a, s.k, b, s.n, 0.0f, c, s.n);
      });
  return 0;
}
