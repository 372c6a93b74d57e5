// The OpenBLAS peer: cblas_sgemm on the same shapes. The driver runs it with
// OPENBLAS_CORETYPE=Cooperlake (OpenBLAS mis-detects this CPU) and
// OPENBLAS_NUM_THREADS set, i.e. OpenBLAS as tuned as it gets here.
#include <cblas.h>

#include <cstdlib>

#include "tests/bench/gemm_timer.h"

int main(int argc, char** argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  tessel::bench::TimeGemms("openblas-tuned", seconds,
                           [](const float* a, const float* b, float* c, const tessel::bench::GemmShape& s) {
                             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a,
                                         s.k, b, s.n, 0.0f, c, s.n);
                           });
  return 0;
}
