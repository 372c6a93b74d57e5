#include "ops/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cpu/onednn_eltwise.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

Tensor Softmax(const Tensor& x, const SoftmaxOptions& options) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && x.ndim() >= 1)
      << "softmax needs an f32 tensor of rank >= 1; got " << x.dtype() << " " << x.shape();
  const int64_t cols = x.shape()[-1], rows = cols == 0 ? 0 : x.numel() / cols;
  const int64_t q = x.ndim() >= 2 ? x.shape()[-2] : 1;
  TESSEL_CHECK(!options.causal || x.ndim() >= 2)
      << "causal softmax needs [..., q, k] scores; got " << x.shape();
  const int64_t queries = options.queries > 0 ? options.queries : q, offset = options.query_offset;
  TESSEL_CHECK(offset >= 0 && offset + q <= queries)
      << "causal softmax: query rows [" << offset << ", " << offset + q << ") are not inside the " << queries
      << " queries";
  const bool masked = options.mask.defined();
  if (masked) {
    TESSEL_CHECK(options.mask.dtype() == DType::kBool)
        << "softmax mask must be bool (true = keep); got " << options.mask.dtype();
    TESSEL_CHECK(BroadcastShapes(options.mask.shape(), x.shape()) == x.shape())
        << "softmax mask of shape " << options.mask.shape() << " does not broadcast to the scores "
        << x.shape();
  }
  const BroadcastIndex im(masked ? options.mask.shape() : x.shape(), x.shape());
  const bool* mask = masked ? options.mask.data<bool>() : nullptr;
  const int64_t mask_step = im.inner_stride();
  Tensor out = Tensor::Empty(x.shape(), DType::kFloat32);
  const float* in = x.data<float>();
  float* y = out.data<float>();
  // Three passes, so that the exponentials are one vectorized call (oneDNN)
  // rather than std::exp an element at a time: the shifted scores (-inf
  // where masked: exp gives 0), exp in place, then each row normalized. A
  // row with a NaN or +inf score, or whose kept scores are all -inf, is NaN
  // throughout, as the GPU's and PyTorch's softmax give (exp(NaN), or
  // inf - inf, reaches the sum); it is written as such, since oneDNN's exp
  // clamps its argument and would turn a NaN finite.
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  std::vector<char> nan_row(static_cast<size_t>(rows), 0);
  ParallelFor(rows, rows * cols > 16384, [&](int64_t r) {
    const float* xr = in + r * cols;
    float* yr = y + r * cols;
    const int64_t qi = r % q;
    const int64_t last = options.causal ? offset + qi + cols - queries : cols - 1;  // keys after it: masked
    const bool* mask_row = masked ? mask + im(r * cols) : nullptr;  // steps by im.inner_stride()
    int64_t kept = 0;
    bool odd = false;
    float mx = kMasked;
    for (int64_t c = 0; c < cols; ++c) {
      if (c <= last && (!masked || mask_row[c * mask_step])) {
        const float v = xr[c] * options.scale;
        odd |= std::isnan(v) || v == std::numeric_limits<float>::infinity();
        mx = std::max(mx, v);
        yr[c] = v;
        ++kept;
      } else {
        yr[c] = kMasked;
      }
    }
    if (odd || (kept > 0 && mx == kMasked)) {
      nan_row[static_cast<size_t>(r)] = 1;
      return;
    }
    const float shift = kept == 0 ? 0.0f : mx;  // a row with every key masked is all -inf: exp makes it 0
    for (int64_t c = 0; c < cols; ++c) yr[c] -= shift;
  });
  EltwiseForward(Eltwise::kExp, y, y, rows * cols);
  ParallelFor(rows, rows * cols > 16384, [&](int64_t r) {
    float* yr = y + r * cols;
    if (nan_row[static_cast<size_t>(r)]) {
      std::fill(yr, yr + cols, std::numeric_limits<float>::quiet_NaN());
      return;
    }
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += yr[c];
    const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;  // no visible key: zeros
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  });
  return out;
}

Tensor SoftmaxGrad(const Tensor& y, const Tensor& dy, float scale) {
  TESSEL_CHECK(y.shape() == dy.shape())
      << "softmax gradient of shape " << dy.shape() << " for output " << y.shape();
  const int64_t cols = y.shape()[-1], rows = cols == 0 ? 0 : y.numel() / cols;
  Tensor out = Tensor::Empty(y.shape(), DType::kFloat32);
  const float* py = y.data<float>();
  const float* pg = dy.data<float>();
  float* dx = out.data<float>();
  ParallelFor(rows, rows * cols > 16384, [&](int64_t r) {
    const float* yr = py + r * cols;
    const float* gr = pg + r * cols;
    double dot = 0;
    for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(yr[c]) * gr[c];
    for (int64_t c = 0; c < cols; ++c) dx[r * cols + c] = scale * yr[c] * (gr[c] - static_cast<float>(dot));
  });
  return out;
}

}  // namespace tessel::cpu
