#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/swiglu.h"

namespace tessel::cuda {
namespace {

__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

template <typename T>
__global__ void SwigluKernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y,
                             int64_t n) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const float g = ToF32(gate[i]);
    y[i] = FromF32<T>(g * Sigmoid(g) * ToF32(up[i]));
  }
}

template <typename T>
__global__ void SwigluGradKernel(const T* __restrict__ dy, const T* __restrict__ gate,
                                 const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup,
                                 int64_t n) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const float g = ToF32(gate[i]), u = ToF32(up[i]), d = ToF32(dy[i]);
    const float sig = Sigmoid(g);
    dup[i] = FromF32<T>(d * g * sig);
    dgate[i] = FromF32<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
  }
}

void CheckSame(const char* op, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dtype() == b.dtype() && a.shape() == b.shape())
      << op << " needs two tensors of one dtype and shape; got " << a.dtype() << " " << a.shape() << " and "
      << b.dtype() << " " << b.shape();
}

}  // namespace

Tensor Swiglu(const Tensor& gate, const Tensor& up) {
  CheckSame("swiglu", gate, up);
  CheckOnDevice("swiglu", gate.device(), {gate, up});
  SetDevice(gate.device());
  Tensor y = Tensor::Empty(gate.shape(), gate.dtype(), gate.device());
  const int64_t n = gate.numel();
  if (n == 0) return y;
  VisitFloat("swiglu", gate.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    SwigluKernel<T><<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<const T*>(gate.raw_data()),
                                                                 static_cast<const T*>(up.raw_data()),
                                                                 static_cast<T*>(y.raw_data()), n);
  });
  CheckLaunch("swiglu kernel");
  return y;
}

SwigluGrads SwigluGrad(const Tensor& dy, const Tensor& gate, const Tensor& up) {
  CheckSame("swiglu_grad", gate, up);
  CheckSame("swiglu_grad", dy, gate);
  CheckOnDevice("swiglu_grad", gate.device(), {dy, gate, up});
  SetDevice(gate.device());
  SwigluGrads r{Tensor::Empty(gate.shape(), gate.dtype(), gate.device()),
                Tensor::Empty(gate.shape(), gate.dtype(), gate.device())};
  const int64_t n = gate.numel();
  if (n == 0) return r;
  VisitFloat("swiglu_grad", gate.dtype(), [&](auto type) {
    using T = typename decltype(type)::type;
    SwigluGradKernel<T><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
        static_cast<const T*>(dy.raw_data()), static_cast<const T*>(gate.raw_data()),
        static_cast<const T*>(up.raw_data()), static_cast<T*>(r.dgate.raw_data()),
        static_cast<T*>(r.dup.raw_data()), n);
  });
  CheckLaunch("swiglu_grad kernel");
  return r;
}

}  // namespace tessel::cuda
