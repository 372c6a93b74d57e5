#include "ops/cpu/cross_entropy.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {
void Check(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  TESSEL_CHECK(logits.dtype() == DType::kFloat32 && logits.ndim() == 2)
      << "cross_entropy needs f32 logits [N, C]; got " << logits.dtype() << " " << logits.shape();
  TESSEL_CHECK(labels.dtype() == DType::kInt64 && labels.shape() == Shape{logits.shape()[0]})
      << "cross_entropy needs i64 labels [" << logits.shape()[0] << "]; got " << labels.dtype() << " "
      << labels.shape();
  const int64_t c = logits.shape()[1];
  const int64_t* y = labels.data<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    TESSEL_CHECK(y[i] == ignore_index || (y[i] >= 0 && y[i] < c))
        << "cross_entropy label " << y[i] << " at row " << i << " is outside [0, " << c << ") and is not the "
        << "ignore_index " << ignore_index;
  }
}

// log(sum(exp(row))) computed stably.
double LogSumExp(const float* row, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(row[j]) - mx);
  return mx + std::log(s);
}
}  // namespace

Tensor SparseCrossEntropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  Check(logits, labels, ignore_index);
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  Tensor loss = Tensor::Empty({n}, DType::kFloat32);
  const float* z = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  float* out = loss.data<float>();
  ParallelFor(n, n * c > 16384, [&](int64_t i) {
    out[i] = y[i] == ignore_index ? 0.0f : static_cast<float>(LogSumExp(z + i * c, c) - z[i * c + y[i]]);
  });
  return loss;
}

Tensor SparseCrossEntropyGrad(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                              int64_t ignore_index) {
  Check(logits, labels, ignore_index);
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  TESSEL_CHECK(dloss.shape() == Shape{n})
      << "cross_entropy gradient of shape " << dloss.shape() << "; expected [" << n << "]";
  Tensor dz = Tensor::Empty(logits.shape(), DType::kFloat32);
  const float* z = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  const float* g = dloss.data<float>();
  float* d = dz.data<float>();
  ParallelFor(n, n * c > 16384, [&](int64_t i) {
    float* row = d + i * c;
    if (y[i] == ignore_index) {
      for (int64_t j = 0; j < c; ++j) row[j] = 0.0f;
      return;
    }
    const double lse = LogSumExp(z + i * c, c);
    for (int64_t j = 0; j < c; ++j) row[j] = static_cast<float>(std::exp(z[i * c + j] - lse)) * g[i];
    row[y[i]] -= g[i];
  });
  return dz;
}

}  // namespace tessel::cpu
