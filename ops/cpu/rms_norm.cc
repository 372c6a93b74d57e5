#include "ops/cpu/rms_norm.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {
void CheckArgs(const char* op, const Tensor& x, const Tensor& weight) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && x.ndim() >= 1)
      << op << " needs an f32 tensor of rank >= 1; got " << x.dtype() << " " << x.shape();
  TESSEL_CHECK(weight.dtype() == DType::kFloat32 && weight.shape() == Shape{x.shape()[-1]})
      << op << ": weight " << weight.dtype() << " " << weight.shape() << " for x " << x.shape()
      << "; expected f32 [" << x.shape()[-1] << "]";
}

// 1 / sqrt(mean(x^2) + eps) of one row, summed in double.
double RowRstd(const float* row, int64_t d, float eps) {
  double s2 = 0;
  for (int64_t c = 0; c < d; ++c) s2 += static_cast<double>(row[c]) * row[c];
  return 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
}
}  // namespace

Tensor RmsNorm(const Tensor& x, const Tensor& weight, float eps) {
  CheckArgs("rms_norm", x, weight);
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  Tensor y = Tensor::Empty(x.shape(), DType::kFloat32);
  const float* in = x.data<float>();
  const float* w = weight.data<float>();
  float* out = y.data<float>();
  ParallelFor(rows, rows * d > 16384, [&](int64_t i) {
    const float* xr = in + i * d;
    // Normalized in f32 and then scaled, as Hugging Face's LlamaRMSNorm does.
    const float rstd = static_cast<float>(RowRstd(xr, d, eps));
    for (int64_t c = 0; c < d; ++c) out[i * d + c] = w[c] * (xr[c] * rstd);
  });
  return y;
}

RmsNormGrads RmsNormGrad(const Tensor& dy, const Tensor& x, const Tensor& weight, float eps) {
  CheckArgs("rms_norm_grad", x, weight);
  TESSEL_CHECK(dy.dtype() == DType::kFloat32 && dy.shape() == x.shape())
      << "rms_norm_grad: dy " << dy.dtype() << " " << dy.shape() << " for x " << x.shape();
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  RmsNormGrads out{Tensor::Empty(x.shape(), DType::kFloat32), Tensor::Empty({d}, DType::kFloat32)};
  const float* px = x.data<float>();
  const float* pg = dy.data<float>();
  const float* w = weight.data<float>();
  float* dx = out.dx.data<float>();
  std::vector<double> dweight(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * d;
    const float* gr = pg + i * d;
    const double rstd = RowRstd(xr, d, eps);
    // y = w x rstd: dx = rstd (dy w) - x rstd^3 mean(dy w x).
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) {
      dot += static_cast<double>(gr[c]) * w[c] * xr[c];
      dweight[c] += static_cast<double>(gr[c]) * xr[c] * rstd;
    }
    const double k = rstd * rstd * rstd * dot / static_cast<double>(d);
    for (int64_t c = 0; c < d; ++c) dx[i * d + c] = static_cast<float>(rstd * gr[c] * w[c] - xr[c] * k);
  }
  float* dw = out.dweight.data<float>();
  for (int64_t c = 0; c < d; ++c) dw[c] = static_cast<float>(dweight[c]);
  return out;
}

}  // namespace tessel::cpu
