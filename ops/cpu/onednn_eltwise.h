// oneDNN's eltwise primitives over n contiguous f32s: vectorized code for
// the functions a loop would call an element at a time (erf, tanh, exp).
// One primitive is made per (function, direction, size) and thread and
// kept, in a bounded cache (a model uses few sizes; a job whose shapes vary
// does not grow it without end).
#pragma once

#include <cstdint>

namespace tessel::cpu {

enum class Eltwise { kGeluErf, kGeluTanh, kExp };

// y = f(x); y may be x.
void EltwiseForward(Eltwise f, const float* x, float* y, int64_t n);
// dx = dy * f'(x).
void EltwiseBackward(Eltwise f, const float* x, const float* dy, float* dx, int64_t n);

}  // namespace tessel::cpu
