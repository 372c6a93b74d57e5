#include "ops/cpu/layer_norm.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {
Shape RowShape(const Shape& x) { return Shape(std::vector<int64_t>(x.dims().begin(), x.dims().end() - 1)); }
}  // namespace

LayerNormResult LayerNorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  TESSEL_CHECK(x.dtype() == DType::kFloat32 && x.ndim() >= 1)
      << "layer_norm needs an f32 tensor of rank >= 1; got " << x.dtype() << " " << x.shape();
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  for (const Tensor* p : {&gamma, &beta}) {
    TESSEL_CHECK(!p->defined() || p->shape() == Shape{d})
        << "layer_norm weight/bias of shape " << p->shape() << " for normalized size " << d << "; expected ["
        << d << "]";
  }
  LayerNormResult r{Tensor::Empty(x.shape(), DType::kFloat32),
                    Tensor::Empty(RowShape(x.shape()), DType::kFloat32),
                    Tensor::Empty(RowShape(x.shape()), DType::kFloat32)};
  const float* in = x.data<float>();
  const float* g = gamma.defined() ? gamma.data<float>() : nullptr;
  const float* b = beta.defined() ? beta.data<float>() : nullptr;
  float* y = r.y.data<float>();
  float* mean = r.mean.data<float>();
  float* rstd = r.rstd.data<float>();
  ParallelFor(rows, rows * d > 16384, [&](int64_t i) {
    const float* xr = in + i * d;
    double s = 0, s2 = 0;
    for (int64_t c = 0; c < d; ++c) s += xr[c];
    const double mu = s / static_cast<double>(d);
    for (int64_t c = 0; c < d; ++c) s2 += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(s2 / static_cast<double>(d) + eps);
    mean[i] = static_cast<float>(mu);
    rstd[i] = static_cast<float>(rs);
    for (int64_t c = 0; c < d; ++c) {
      float v = static_cast<float>((xr[c] - mu) * rs);
      y[i * d + c] = v * (g ? g[c] : 1.0f) + (b ? b[c] : 0.0f);
    }
  });
  return r;
}

LayerNormGrads LayerNormGrad(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                             const Tensor& gamma) {
  TESSEL_CHECK(dy.shape() == x.shape())
      << "layer_norm gradient of shape " << dy.shape() << " for input " << x.shape();
  const int64_t d = x.shape()[-1], rows = d == 0 ? 0 : x.numel() / d;
  LayerNormGrads out{Tensor::Empty(x.shape(), DType::kFloat32), Tensor::Empty({d}, DType::kFloat32),
                     Tensor::Empty({d}, DType::kFloat32)};
  const float* px = x.data<float>();
  const float* pg = dy.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  const float* gm = gamma.defined() ? gamma.data<float>() : nullptr;
  float* dx = out.dx.data<float>();
  std::vector<double> dgamma(d, 0.0), dbeta(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = px + i * d;
    const float* gr = pg + i * d;
    // dxhat = dy * gamma; dx = rstd/d * (d*dxhat - sum(dxhat) - xhat*sum(dxhat*xhat))
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t c = 0; c < d; ++c) {
      const double xhat = (xr[c] - pm[i]) * static_cast<double>(pr[i]);
      const double dxhat = gr[c] * (gm ? gm[c] : 1.0f);
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dgamma[c] += gr[c] * xhat;
      dbeta[c] += gr[c];
    }
    for (int64_t c = 0; c < d; ++c) {
      const double xhat = (xr[c] - pm[i]) * static_cast<double>(pr[i]);
      const double dxhat = gr[c] * (gm ? gm[c] : 1.0f);
      dx[i * d + c] =
          static_cast<float>(pr[i] / static_cast<double>(d) *
                             (static_cast<double>(d) * dxhat - sum_dxhat - xhat * sum_dxhat_xhat));
    }
  }
  for (int64_t c = 0; c < d; ++c) {
    out.dgamma.data<float>()[c] = static_cast<float>(dgamma[c]);
    out.dbeta.data<float>()[c] = static_cast<float>(dbeta[c]);
  }
  return out;
}

}  // namespace tessel::cpu
