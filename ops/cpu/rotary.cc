#include "ops/cpu/rotary.h"

#include <cmath>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

Tensor Rotary(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && x.ndim() == 4)
      << "rotary needs f32 x [batch, seq, heads, head_dim]; got " << x.dtype() << " " << x.shape();
  const int64_t b = x.shape()[0], s = x.shape()[1], n = x.shape()[2], d = x.shape()[3], half = d / 2;
  TESSEL_CHECK(static_cast<int64_t>(inv_freq.size()) == half)
      << "rotary: " << inv_freq.size() << " frequencies for head_dim " << d;
  const bool per_row = positions.ndim() == 2;
  Tensor y = Tensor::Empty(x.shape(), DType::kFloat32);
  const float* in = x.data<float>();
  const int64_t* pos = positions.data<int64_t>();
  float* out = y.data<float>();
  const double sign = inverse ? -1.0 : 1.0;
  ParallelFor(b * s, b * s * n * d > 16384, [&](int64_t row) {
    const float p = static_cast<float>(pos[per_row ? row : row % s]);
    for (int64_t j = 0; j < half; ++j) {
      // The angle in f32, as Hugging Face forms it (inv_freq x position).
      const float angle = inv_freq[j] * p;
      const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
      const float sn = static_cast<float>(sign * std::sin(static_cast<double>(angle)));
      for (int64_t h = 0; h < n; ++h) {
        const int64_t base = (row * n + h) * d;
        const float x1 = in[base + j], x2 = in[base + j + half];
        out[base + j] = x1 * c - x2 * sn;
        out[base + j + half] = x2 * c + x1 * sn;
      }
    }
  });
  return y;
}

}  // namespace tessel::cpu
