#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {
struct Dims {
  int64_t n, sq, sk, d;
};

Dims CheckedDims(const Tensor& q, const Tensor& k, const Tensor& v) {
  for (const Tensor* t : {&q, &k, &v}) {
    TESSEL_CHECK(t->dtype() == DType::kFloat32 && t->ndim() >= 3)
        << "attention's CPU kernel needs f32 q, k and v of rank >= 3; got " << t->ToString();
  }
  const int64_t d = q.shape()[-1], sq = q.shape()[-2], sk = k.shape()[-2];
  TESSEL_CHECK(k.shape() == v.shape() && k.shape()[-1] == d &&
               k.numel() / std::max<int64_t>(sk * d, 1) == q.numel() / std::max<int64_t>(sq * d, 1))
      << "attention: q " << q.shape() << ", k " << k.shape() << ", v " << v.shape()
      << "; expected [..., sq, d], [..., sk, d], [..., sk, d] with the same leading dims";
  return {sq * d == 0 ? 0 : q.numel() / (sq * d), sq, sk, d};
}

// Keys [0, KeyEnd) are visible to local query row i.
int64_t KeyEnd(const AttentionOptions& o, int64_t i, int64_t sk) {
  return o.causal ? std::clamp<int64_t>(i + o.causal_shift + 1, 0, sk) : sk;
}

double Dot(const float* a, const float* b, int64_t d) {
  double s = 0;
  for (int64_t c = 0; c < d; ++c) s += static_cast<double>(a[c]) * b[c];
  return s;
}
}  // namespace

std::vector<Tensor> Attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const Dims s = CheckedDims(q, k, v);
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32);
  std::vector<int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  Tensor lse = Tensor::Empty(Shape(lse_dims), DType::kFloat32);
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>();
  float *op = out.data<float>(), *lp = lse.data<float>();
  ParallelFor(s.n * s.sq, s.n * s.sq * s.sk * s.d > 65536, [&](int64_t r) {
    const int64_t b = r / s.sq, i = r % s.sq, end = KeyEnd(o, i, s.sk);
    const float* qr = qp + r * s.d;
    std::vector<double> scores(end), acc(s.d, 0.0);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < end; ++j) {
      scores[j] = static_cast<float>(Dot(qr, kp + (b * s.sk + j) * s.d, s.d)) * o.scale;
      mx = std::max(mx, scores[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < end; ++j) {
      const double p = std::exp(scores[j] - mx);
      sum += p;
      const float* vr = vp + (b * s.sk + j) * s.d;
      for (int64_t c = 0; c < s.d; ++c) acc[c] += p * vr[c];
    }
    for (int64_t c = 0; c < s.d; ++c) op[r * s.d + c] = sum > 0 ? static_cast<float>(acc[c] / sum) : 0.0f;
    lp[r] = sum > 0 ? static_cast<float>(mx + std::log(sum)) : std::numeric_limits<float>::infinity();
  });
  return {out, lse};
}

std::vector<Tensor> AttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionOptions& o) {
  const Dims s = CheckedDims(q, k, v);
  TESSEL_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && lse.numel() == s.n * s.sq &&
               dout.dtype() == DType::kFloat32 && out.dtype() == DType::kFloat32)
      << "attention_grad: out " << out.ToString() << ", lse " << lse.ToString() << ", dout "
      << dout.ToString() << " for q " << q.shape()
      << "; expected f32 out and dout of q's shape and one lse per query";
  Tensor dq = Tensor::Empty(q.shape(), DType::kFloat32), dk = Tensor::Empty(k.shape(), DType::kFloat32),
         dv = Tensor::Empty(v.shape(), DType::kFloat32);
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *op = out.data<float>(),
              *lp = lse.data<float>(), *gp = dout.data<float>();
  float *dqp = dq.data<float>(), *dkp = dk.data<float>(), *dvp = dv.data<float>();
  // One (batch) slice per thread: the key gradients gather over its queries.
  ParallelFor(s.n, s.n * s.sq * s.sk * s.d > 65536, [&](int64_t b) {
    std::vector<double> gk(s.sk * s.d, 0.0), gv(s.sk * s.d, 0.0), gq(s.d);
    for (int64_t i = 0; i < s.sq; ++i) {
      const int64_t r = b * s.sq + i, end = KeyEnd(o, i, s.sk);
      const float *qr = qp + r * s.d, *gr = gp + r * s.d;
      const double delta = Dot(gr, op + r * s.d, s.d);  // sum_j p_j dp_j
      std::fill(gq.begin(), gq.end(), 0.0);
      for (int64_t j = 0; j < end; ++j) {
        const float *kr = kp + (b * s.sk + j) * s.d, *vr = vp + (b * s.sk + j) * s.d;
        const double score = static_cast<float>(Dot(qr, kr, s.d)) * o.scale;
        const double p = std::exp(score - lp[r]);
        const double ds = p * (Dot(gr, vr, s.d) - delta) * o.scale;
        for (int64_t c = 0; c < s.d; ++c) {
          gv[j * s.d + c] += p * gr[c];
          gk[j * s.d + c] += ds * qr[c];
          gq[c] += ds * kr[c];
        }
      }
      for (int64_t c = 0; c < s.d; ++c) dqp[r * s.d + c] = static_cast<float>(gq[c]);
    }
    for (int64_t e = 0; e < s.sk * s.d; ++e) {
      dkp[b * s.sk * s.d + e] = static_cast<float>(gk[e]);
      dvp[b * s.sk * s.d + e] = static_cast<float>(gv[e]);
    }
  });
  return {dq, dk, dv};
}

}  // namespace tessel::cpu
