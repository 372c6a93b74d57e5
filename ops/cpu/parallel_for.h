// Loops over OpenMP's threads only when the work pays for them.
//
// An `if` clause on `omp parallel for` is not enough: libgomp still builds
// a team for a region it then runs on one thread (an aligned allocation and
// a futex wake of its idle pool), about a microsecond per call — more than
// the kernel itself on a small tensor, and the largest host cost of a
// compiled step of small ops. Below the threshold the loop runs inline.
#pragma once

#include <cstdint>

namespace tessel::cpu {

// body(i) for i in [0, n): spread over the threads when `parallel`.
template <typename Body>
inline void ParallelFor(int64_t n, bool parallel, const Body& body) {
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace tessel::cpu
