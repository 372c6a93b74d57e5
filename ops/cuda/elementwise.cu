#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/reduce.h"

namespace tessel::cuda {
namespace {

// The CPU's constants (ops/cpu/elementwise.cc), so both devices round alike.
constexpr float kSqrt2 = 1.41421356237309504880f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1/sqrt(2*pi)

template <BinaryOp Op, typename T>
__device__ __forceinline__ T Apply(T x, T y) {
  if constexpr (Op == BinaryOp::kAdd) return x + y;
  if constexpr (Op == BinaryOp::kSub) return x - y;
  if constexpr (Op == BinaryOp::kMul) return x * y;
  if constexpr (Op == BinaryOp::kDiv) return x / y;
}

// 16-bit operands compute in float and round once; i64 stays integral.
template <BinaryOp Op>
struct BinaryFn {
  template <typename T>
  __device__ T operator()(T x, T y) const {
    if constexpr (std::is_same_v<T, int64_t>) {
      return Apply<Op>(x, y);
    } else {
      return FromF32<T>(Apply<Op>(ToF32(x), ToF32(y)));
    }
  }
};

template <BinaryOp Op>
struct ScalarFn {
  float s;
  template <typename T>
  __device__ T operator()(T x) const {
    return FromF32<T>(Apply<Op>(ToF32(x), s));
  }
};

template <UnaryOp Op>
__device__ __forceinline__ float UnaryValue(float v) {
  if constexpr (Op == UnaryOp::kRelu) return v > 0 ? v : 0.0f;
  if constexpr (Op == UnaryOp::kGeluErf) return 0.5f * v * (1.0f + erff(v / kSqrt2));
  if constexpr (Op == UnaryOp::kGeluTanh)
    return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  if constexpr (Op == UnaryOp::kTanh) return tanhf(v);
  if constexpr (Op == UnaryOp::kExp) return expf(v);
  if constexpr (Op == UnaryOp::kLog) return logf(v);
  if constexpr (Op == UnaryOp::kSqrt) return sqrtf(v);
  if constexpr (Op == UnaryOp::kNeg) return -v;
}

template <UnaryOp Op>
__device__ __forceinline__ float UnaryGradValue(float v, float g) {
  float d = 0;
  if constexpr (Op == UnaryOp::kRelu) d = v > 0 ? 1.0f : 0.0f;
  if constexpr (Op == UnaryOp::kGeluErf)
    d = 0.5f * (1.0f + erff(v / kSqrt2)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
  if constexpr (Op == UnaryOp::kGeluTanh) {
    const float t = tanhf(kSqrt2OverPi * (v + 0.044715f * v * v * v));
    d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
  }
  if constexpr (Op == UnaryOp::kTanh) {
    const float t = tanhf(v);
    d = 1.0f - t * t;
  }
  if constexpr (Op == UnaryOp::kExp) d = expf(v);
  if constexpr (Op == UnaryOp::kLog) d = 1.0f / v;
  if constexpr (Op == UnaryOp::kSqrt) d = 0.5f / sqrtf(v);
  if constexpr (Op == UnaryOp::kNeg) d = -1.0f;
  return d * g;
}

template <UnaryOp Op>
struct UnaryFn {
  template <typename T>
  __device__ T operator()(T v) const {
    return FromF32<T>(UnaryValue<Op>(ToF32(v)));
  }
};

template <UnaryOp Op>
struct UnaryGradFn {
  template <typename T>
  __device__ T operator()(T v, T g) const {
    return FromF32<T>(UnaryGradValue<Op>(ToF32(v), ToF32(g)));
  }
};

template <typename T, BinaryOp Op>
void RunBinary(const Tensor& a, const Tensor& b, const Tensor& out) {
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  const int64_t n = out.numel();
  // Equal element counts mean neither operand is broadcast (n > 0 here).
  if (a.numel() == n && b.numel() == n) {
    LaunchMap(cpu::BinaryOpName(Op), n, BinaryFn<Op>{}, po, pa, pb);
  } else {
    LaunchBroadcast(cpu::BinaryOpName(Op), out.shape(), BinaryFn<Op>{}, po, {a.shape(), b.shape()}, pa, pb);
  }
}

template <typename T>
void RunBinary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::kAdd:
      return RunBinary<T, BinaryOp::kAdd>(a, b, out);
    case BinaryOp::kSub:
      return RunBinary<T, BinaryOp::kSub>(a, b, out);
    case BinaryOp::kMul:
      return RunBinary<T, BinaryOp::kMul>(a, b, out);
    case BinaryOp::kDiv:
      return RunBinary<T, BinaryOp::kDiv>(a, b, out);
  }
}

template <UnaryOp Op, typename T>
void RunUnary(const Tensor& x, const Tensor& out) {
  LaunchMap(cpu::UnaryOpName(Op), x.numel(), UnaryFn<Op>{}, static_cast<T*>(out.raw_data()),
            static_cast<const T*>(x.raw_data()));
}

template <UnaryOp Op, typename T>
void RunUnaryGrad(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  LaunchMap(cpu::UnaryOpName(Op), x.numel(), UnaryGradFn<Op>{}, static_cast<T*>(dx.raw_data()),
            static_cast<const T*>(x.raw_data()), static_cast<const T*>(dy.raw_data()));
}

template <typename T>
void RunScalar(BinaryOp op, const Tensor& a, float s, const Tensor& out) {
  const T* x = static_cast<const T*>(a.raw_data());
  T* y = static_cast<T*>(out.raw_data());
  const int64_t n = a.numel();
  const char* name = cpu::BinaryOpName(op);
  switch (op) {
    case BinaryOp::kAdd:
      return LaunchMap(name, n, ScalarFn<BinaryOp::kAdd>{s}, y, x);
    case BinaryOp::kSub:
      return LaunchMap(name, n, ScalarFn<BinaryOp::kSub>{s}, y, x);
    case BinaryOp::kMul:
      return LaunchMap(name, n, ScalarFn<BinaryOp::kMul>{s}, y, x);
    case BinaryOp::kDiv:
      return LaunchMap(name, n, ScalarFn<BinaryOp::kDiv>{s}, y, x);
  }
}

// Calls run.template operator()<Op>() with the runtime op as a template argument.
template <typename Run>
void VisitUnary(UnaryOp op, Run&& run) {
  switch (op) {
    case UnaryOp::kRelu:
      return run.template operator()<UnaryOp::kRelu>();
    case UnaryOp::kGeluErf:
      return run.template operator()<UnaryOp::kGeluErf>();
    case UnaryOp::kGeluTanh:
      return run.template operator()<UnaryOp::kGeluTanh>();
    case UnaryOp::kTanh:
      return run.template operator()<UnaryOp::kTanh>();
    case UnaryOp::kExp:
      return run.template operator()<UnaryOp::kExp>();
    case UnaryOp::kLog:
      return run.template operator()<UnaryOp::kLog>();
    case UnaryOp::kSqrt:
      return run.template operator()<UnaryOp::kSqrt>();
    case UnaryOp::kNeg:
      return run.template operator()<UnaryOp::kNeg>();
  }
}

}  // namespace

Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = cpu::BinaryOpName(op);
  TESSEL_CHECK(a.dtype() == b.dtype())
      << name << ": dtypes differ: a is " << a.dtype() << " " << a.shape() << " but b is " << b.dtype() << " "
      << b.shape() << "; cast one (fn::cast)";
  CheckOnDevice(name, a.device(), {a, b});
  SetDevice(a.device());
  Shape shape = cpu::BroadcastShapes(a.shape(), b.shape());
  auto run = [&]<typename T>(TypeTag<T>) {
    Tensor out = Tensor::Empty(shape, a.dtype(), a.device());
    if (shape.numel() > 0) RunBinary<T>(op, a, b, out);
    return out;
  };
  if (a.dtype() == DType::kInt64) return run(TypeTag<int64_t>{});
  TESSEL_CHECK(IsFloating(a.dtype()))
      << name << " supports f32, bf16, f16 and i64 on CUDA; got " << a.dtype();
  return VisitFloat(name, a.dtype(), run);
}

Tensor BinaryScalar(BinaryOp op, const Tensor& a, double scalar) {
  SetDevice(a.device());
  Tensor out = Tensor::Empty(a.shape(), a.dtype(), a.device());
  VisitFloat(cpu::BinaryOpName(op), a.dtype(),
             [&]<typename T>(TypeTag<T>) { RunScalar<T>(op, a, static_cast<float>(scalar), out); });
  return out;
}

Tensor SumToShape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  // Sum over the leading dims the operand lacked and the dims it had as 1.
  const int64_t lead = grad.ndim() - shape.ndim();
  std::vector<int64_t> axes;
  for (int64_t d = 0; d < grad.ndim(); ++d) {
    if (d < lead || (shape.dims()[d - lead] == 1 && grad.shape()[d] != 1)) axes.push_back(d);
  }
  return cuda::Reduce(cpu::ReduceOp::kSum, grad, axes, /*keepdim=*/false).Reshape(shape);
}

Tensor Unary(UnaryOp op, const Tensor& x) {
  SetDevice(x.device());
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  VisitFloat(cpu::UnaryOpName(op), x.dtype(),
             [&]<typename T>(TypeTag<T>) { VisitUnary(op, [&]<UnaryOp Op>() { RunUnary<Op, T>(x, out); }); });
  return out;
}

Tensor UnaryGrad(UnaryOp op, const Tensor& x, const Tensor& dy) {
  const char* name = cpu::UnaryOpName(op);
  TESSEL_CHECK(dy.shape() == x.shape())
      << name << " gradient of shape " << dy.shape() << " for an input of shape " << x.shape();
  TESSEL_CHECK(dy.dtype() == x.dtype())
      << name << " gradient: x is " << x.dtype() << " but dy is " << dy.dtype() << "; cast one (fn::cast)";
  CheckOnDevice(name, x.device(), {x, dy});
  SetDevice(x.device());
  Tensor out = Tensor::Empty(x.shape(), x.dtype(), x.device());
  VisitFloat(name, x.dtype(), [&]<typename T>(TypeTag<T>) {
    VisitUnary(op, [&]<UnaryOp Op>() { RunUnaryGrad<Op, T>(x, dy, out); });
  });
  return out;
}

}  // namespace tessel::cuda
