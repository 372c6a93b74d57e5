#include "ops/cpu/swiglu.h"

#include <cmath>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {
void CheckSame(const char* op, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dtype() == DType::kFloat32 && b.dtype() == DType::kFloat32 && a.shape() == b.shape())
      << op << " needs two f32 tensors of one shape; got " << a.dtype() << " " << a.shape() << " and "
      << b.dtype() << " " << b.shape();
}
float Sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
}  // namespace

Tensor Swiglu(const Tensor& gate, const Tensor& up) {
  CheckSame("swiglu", gate, up);
  Tensor y = Tensor::Empty(gate.shape(), DType::kFloat32);
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* out = y.data<float>();
  ParallelFor(gate.numel(), gate.numel() > 16384, [&](int64_t i) { out[i] = g[i] * Sigmoid(g[i]) * u[i]; });
  return y;
}

SwigluGrads SwigluGrad(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  CheckSame("swiglu_grad", gate, up);
  CheckSame("swiglu_grad", dy, gate);
  SwigluGrads r{Tensor::Empty(gate.shape(), DType::kFloat32), Tensor::Empty(gate.shape(), DType::kFloat32)};
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  const float* dyp = dy.data<float>();
  float* dg = r.dgate.data<float>();
  float* du = r.dup.data<float>();
  ParallelFor(gate.numel(), gate.numel() > 16384, [&](int64_t i) {
    const float sig = Sigmoid(g[i]);
    du[i] = dyp[i] * g[i] * sig;
    // silu'(g) = sig (1 + g (1 - sig))
    dg[i] = dyp[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  });
  return r;
}

}  // namespace tessel::cpu
