#include "ops/cpu/elementwise.h"

#include <cmath>
#include <numbers>
#include <optional>

#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cpu/onednn_eltwise.h"
#include "ops/cpu/parallel_for.h"
#include "ops/cpu/reduce.h"

namespace tessel::cpu {

const char* BinaryOpName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "?";
}

const char* UnaryOpName(UnaryOp op) {
  switch (op) {
    case UnaryOp::kRelu:
      return "relu";
    case UnaryOp::kGeluErf:
      return "gelu";
    case UnaryOp::kGeluTanh:
      return "gelu_tanh";
    case UnaryOp::kTanh:
      return "tanh";
    case UnaryOp::kExp:
      return "exp";
    case UnaryOp::kLog:
      return "log";
    case UnaryOp::kSqrt:
      return "sqrt";
    case UnaryOp::kNeg:
      return "neg";
  }
  return "?";
}

namespace {

template <typename T>
T Apply(BinaryOp op, T x, T y) {
  switch (op) {
    case BinaryOp::kAdd:
      return x + y;
    case BinaryOp::kSub:
      return x - y;
    case BinaryOp::kMul:
      return x * y;
    case BinaryOp::kDiv:
      return x / y;
  }
  return x;
}

// Runs the op over rows of the result's last dimension, so the inner loop
// has constant strides (1 or 0) and vectorises.
template <typename T>
void BinaryRows(BinaryOp op, const T* a, const BroadcastIndex& ia, const T* b, const BroadcastIndex& ib,
                T* out, int64_t rows, int64_t cols) {
  const int64_t sa = ia.inner_stride(), sb = ib.inner_stride();
  ParallelFor(rows, rows * cols > 32768, [&](int64_t r) {
    const T* pa = a + ia(r * cols);
    const T* pb = b + ib(r * cols);
    T* po = out + r * cols;
    switch (op) {
      case BinaryOp::kAdd:
        for (int64_t c = 0; c < cols; ++c) po[c] = pa[c * sa] + pb[c * sb];
        break;
      case BinaryOp::kSub:
        for (int64_t c = 0; c < cols; ++c) po[c] = pa[c * sa] - pb[c * sb];
        break;
      case BinaryOp::kMul:
        for (int64_t c = 0; c < cols; ++c) po[c] = pa[c * sa] * pb[c * sb];
        break;
      case BinaryOp::kDiv:
        for (int64_t c = 0; c < cols; ++c) po[c] = pa[c * sa] / pb[c * sb];
        break;
    }
  });
}

void CheckFloat(const char* op, const Tensor& t) {
  TESSEL_CHECK(t.dtype() == DType::kFloat32)
      << op << " supports f32 on the CPU; got " << t.dtype() << " for " << t.shape();
}

constexpr float kSqrt2 = std::numbers::sqrt2_v<float>;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;   // 1/sqrt(2*pi)

// GELU (erf and tanh forms) and its gradient go through oneDNN's eltwise
// primitives (ops/cpu/onednn_eltwise.h): vectorized code, where the loops
// below call std::erf or std::tanh an element at a time (GELU was a sixth
// of a CPU transformer step). The other activations stay in the loops.
std::optional<Eltwise> OneDnnAlgorithm(UnaryOp op) {
  switch (op) {
    case UnaryOp::kGeluErf:
      return Eltwise::kGeluErf;
    case UnaryOp::kGeluTanh:
      return Eltwise::kGeluTanh;
    default:
      return std::nullopt;
  }
}
}  // namespace

Tensor Binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dtype() == b.dtype()) << BinaryOpName(op) << " of " << a.dtype() << " " << a.shape()
                                       << " and " << b.dtype() << " " << b.shape() << ": dtypes differ";
  TESSEL_CHECK(a.dtype() == DType::kFloat32 || a.dtype() == DType::kInt64)
      << BinaryOpName(op) << " supports f32 and i64 on the CPU; got " << a.dtype();
  Shape shape = BroadcastShapes(a.shape(), b.shape());
  Tensor out = Tensor::Empty(shape, a.dtype());
  const int64_t cols = shape.ndim() == 0 ? 1 : shape[-1];
  const int64_t rows = cols == 0 ? 0 : shape.numel() / cols;
  BroadcastIndex ia(a.shape(), shape), ib(b.shape(), shape);
  if (a.dtype() == DType::kFloat32) {
    BinaryRows(op, a.data<float>(), ia, b.data<float>(), ib, out.data<float>(), rows, cols);
  } else {
    BinaryRows(op, a.data<int64_t>(), ia, b.data<int64_t>(), ib, out.data<int64_t>(), rows, cols);
  }
  return out;
}

Tensor BinaryScalar(BinaryOp op, const Tensor& a, double scalar) {
  CheckFloat(BinaryOpName(op), a);
  Tensor out = Tensor::Empty(a.shape(), a.dtype());
  const float* x = a.data<float>();
  float* y = out.data<float>();
  const float s = static_cast<float>(scalar);
  const int64_t n = a.numel();
  ParallelFor(n, n > 32768, [&](int64_t i) { y[i] = Apply(op, x[i], s); });
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
  return Reduce(ReduceOp::kSum, grad, axes, /*keepdim=*/false).Reshape(shape);
}

Tensor Unary(UnaryOp op, const Tensor& x) {
  CheckFloat(UnaryOpName(op), x);
  Tensor out = Tensor::Empty(x.shape(), DType::kFloat32);
  const float* in = x.data<float>();
  float* y = out.data<float>();
  const int64_t n = x.numel();
  if (const std::optional<Eltwise> alg = OneDnnAlgorithm(op); alg && n > 0) {
    EltwiseForward(*alg, in, y, n);
    return out;
  }
  ParallelFor(n, n > 16384, [&](int64_t i) {
    const float v = in[i];
    switch (op) {
      case UnaryOp::kRelu:
        y[i] = v > 0 ? v : 0.0f;
        break;
      case UnaryOp::kGeluErf:
        y[i] = 0.5f * v * (1.0f + std::erf(v / kSqrt2));
        break;
      case UnaryOp::kGeluTanh:
        y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
        break;
      case UnaryOp::kTanh:
        y[i] = std::tanh(v);
        break;
      case UnaryOp::kExp:
        y[i] = std::exp(v);
        break;
      case UnaryOp::kLog:
        y[i] = std::log(v);
        break;
      case UnaryOp::kSqrt:
        y[i] = std::sqrt(v);
        break;
      case UnaryOp::kNeg:
        y[i] = -v;
        break;
    }
  });
  return out;
}

Tensor UnaryGrad(UnaryOp op, const Tensor& x, const Tensor& dy) {
  CheckFloat(UnaryOpName(op), x);
  TESSEL_CHECK(dy.shape() == x.shape())
      << UnaryOpName(op) << " gradient of shape " << dy.shape() << " for an input of shape " << x.shape();
  Tensor out = Tensor::Empty(x.shape(), DType::kFloat32);
  const float* in = x.data<float>();
  const float* g = dy.data<float>();
  float* dx = out.data<float>();
  const int64_t n = x.numel();
  if (const std::optional<Eltwise> alg = OneDnnAlgorithm(op); alg && n > 0) {
    EltwiseBackward(*alg, in, g, dx, n);
    return out;
  }
  ParallelFor(n, n > 16384, [&](int64_t i) {
    const float v = in[i];
    float d = 0;
    switch (op) {
      case UnaryOp::kRelu:
        d = v > 0 ? 1.0f : 0.0f;
        break;
      case UnaryOp::kGeluErf:
        d = 0.5f * (1.0f + std::erf(v / kSqrt2)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
        break;
      case UnaryOp::kGeluTanh: {
        const float t = std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v));
        d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
        break;
      }
      case UnaryOp::kTanh: {
        const float t = std::tanh(v);
        d = 1.0f - t * t;
        break;
      }
      case UnaryOp::kExp:
        d = std::exp(v);
        break;
      case UnaryOp::kLog:
        d = 1.0f / v;
        break;
      case UnaryOp::kSqrt:
        d = 0.5f / std::sqrt(v);
        break;
      case UnaryOp::kNeg:
        d = -1.0f;
        break;
    }
    dx[i] = d * g[i];
  });
  return out;
}

}  // namespace tessel::cpu
