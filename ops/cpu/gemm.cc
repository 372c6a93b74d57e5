#include "ops/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include "core/error.h"
#include "ops/cpu/broadcast.h"

namespace tessel::cpu {

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum (a shard with no rows): C = beta C; oneDNN rejects it
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TESSEL_CHECK_CODE(status == dnnl_success, StatusCode::kInternal)
      << "oneDNN sgemm failed (status " << static_cast<int>(status) << ") for m=" << m << " n=" << n
      << " k=" << k;
}

Tensor Matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  TESSEL_CHECK(a.dtype() == DType::kFloat32 && b.dtype() == DType::kFloat32)
      << "matmul supports f32 on the CPU; got " << a.dtype() << " and " << b.dtype();
  TESSEL_CHECK(a.ndim() >= 2 && b.ndim() >= 2)
      << "matmul needs operands of rank >= 2; got shapes " << a.shape() << " and " << b.shape();
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const int64_t m = trans_a ? sa[-1] : sa[-2], ka = trans_a ? sa[-2] : sa[-1];
  const int64_t kb = trans_b ? sb[-1] : sb[-2], n = trans_b ? sb[-2] : sb[-1];
  TESSEL_CHECK(ka == kb) << "matmul shapes do not fit: " << sa << (trans_a ? "^T" : "") << " x " << sb
                         << (trans_b ? "^T" : "") << " (inner sizes " << ka << " and " << kb << ")";
  Shape batch_a(std::vector<int64_t>(sa.dims().begin(), sa.dims().end() - 2));
  Shape batch_b(std::vector<int64_t>(sb.dims().begin(), sb.dims().end() - 2));
  Shape batch = BroadcastShapes(batch_a, batch_b);
  std::vector<int64_t> out_dims = batch.dims();
  out_dims.push_back(m);
  out_dims.push_back(n);
  Tensor out = Tensor::Empty(Shape(out_dims), DType::kFloat32);
  const int64_t nb = batch.numel();
  const BroadcastIndex ia(batch_a, batch), ib(batch_b, batch);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = out.data<float>();
  for (int64_t i = 0; i < nb; ++i) {
    Gemm(trans_a, trans_b, m, n, ka, 1.0f, pa + ia(i) * m * ka, sa[-1], pb + ib(i) * ka * n, sb[-1], 0.0f,
         pc + i * m * n, n);
  }
  return out;
}

Shape LinearShape(const std::string& op, const Shape& x, const Shape& weight, const Shape& bias) {
  TESSEL_CHECK(x.ndim() >= 1 && weight.ndim() == 2 && bias.ndim() == 1 && x[-1] == weight[0] &&
               bias[0] == weight[1])
      << op << ": expected x [..., k], weight [k, n] and bias [n]; got x " << x << ", weight " << weight
      << " and bias " << bias;
  std::vector<int64_t> dims = x.dims();
  dims.back() = weight[1];
  return Shape(dims);
}

}  // namespace tessel::cpu
