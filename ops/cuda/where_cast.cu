#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/where_cast.h"

namespace tessel::cuda {
namespace {

// Device stand-ins for core/half.h's host types (same 16-bit layouts).
struct HalfBits {
  uint16_t bits;
};
struct BF16Bits {
  uint16_t bits;
};

template <typename T>
struct DeviceTypeOf {
  using type = T;
};
template <>
struct DeviceTypeOf<Float16> {
  using type = HalfBits;
};
template <>
struct DeviceTypeOf<BFloat16> {
  using type = BF16Bits;
};

template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  return static_cast<float>(v);
}

// Float16::ToFloat (core/half.cc) bit for bit, NaN payloads included.
__device__ __forceinline__ float ToFloat(HalfBits h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

__device__ __forceinline__ float ToFloat(BF16Bits b) {
  return __uint_as_float(static_cast<uint32_t>(b.bits) << 16);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  return static_cast<T>(v);
}

// The hardware conversions round to nearest even like core/half.h; NaNs are
// encoded as core/half.h does, so results match the CPU bit for bit.
template <>
__device__ __forceinline__ HalfBits FromFloat<HalfBits>(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7e00u)};
  return {__half_as_ushort(__float2half_rn(f))};
}

template <>
__device__ __forceinline__ BF16Bits FromFloat<BF16Bits>(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
  return {__bfloat16_as_ushort(__float2bfloat16_rn(f))};
}

template <typename F, typename T>
struct CastFn {
  __device__ T operator()(F v) const {
    if constexpr (std::is_same_v<F, int64_t> && std::is_same_v<T, int64_t>) {
      return v;
    } else {
      return FromFloat<T>(ToFloat(v));
    }
  }
};

struct WhereFn {
  template <typename T>
  __device__ T operator()(bool c, T a, T b) const {
    return c ? a : b;
  }
};

// Compared as float: exact, and -0 == +0 and NaN != NaN as on the CPU.
struct EqualFn {
  template <typename T>
  __device__ bool operator()(T a, T b) const {
    return ToF32(a) == ToF32(b);
  }
};

}  // namespace

Tensor Cast(const Tensor& x, DType dtype) {
  SetDevice(x.device());
  Tensor out = Tensor::Empty(x.shape(), dtype, x.device());
  const int64_t n = x.numel();
  if (n == 0) return out;
  VisitDType(x.dtype(), [&](auto from) {
    using F = typename DeviceTypeOf<decltype(from)>::type;
    VisitDType(dtype, [&](auto to) {
      using T = typename DeviceTypeOf<decltype(to)>::type;
      LaunchMap("cast", n, CastFn<F, T>{}, static_cast<T*>(out.raw_data()),
                static_cast<const F*>(x.raw_data()));
    });
  });
  return out;
}

Tensor Where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(cond.dtype() == DType::kBool) << "where: condition must be bool, got " << cond.dtype();
  TESSEL_CHECK(a.dtype() == b.dtype())
      << "where: a is " << a.dtype() << " but b is " << b.dtype() << "; cast one (fn::cast)";
  CheckOnDevice("where", cond.device(), {cond, a, b});
  SetDevice(cond.device());
  Shape shape = cpu::BroadcastShapes(cpu::BroadcastShapes(cond.shape(), a.shape()), b.shape());
  return VisitFloat("where", a.dtype(), [&]<typename T>(TypeTag<T>) {
    Tensor out = Tensor::Empty(shape, a.dtype(), cond.device());
    const int64_t n = shape.numel();
    if (n == 0) return out;
    const bool* pc = static_cast<const bool*>(cond.raw_data());
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    T* po = static_cast<T*>(out.raw_data());
    if (cond.numel() == n && a.numel() == n && b.numel() == n) {
      LaunchMap("where", n, WhereFn{}, po, pc, pa, pb);
    } else {
      LaunchBroadcast("where", shape, WhereFn{}, po, {cond.shape(), a.shape(), b.shape()}, pc, pa, pb);
    }
    return out;
  });
}

Tensor Equal(const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.dtype() == b.dtype()) << "equal: a is " << a.dtype() << " " << a.shape() << " but b is "
                                       << b.dtype() << " " << b.shape() << "; cast one (fn::cast)";
  CheckOnDevice("equal", a.device(), {a, b});
  SetDevice(a.device());
  Shape shape = cpu::BroadcastShapes(a.shape(), b.shape());
  return VisitFloat("equal", a.dtype(), [&]<typename T>(TypeTag<T>) {
    Tensor out = Tensor::Empty(shape, DType::kBool, a.device());
    const int64_t n = shape.numel();
    if (n == 0) return out;
    const T* pa = static_cast<const T*>(a.raw_data());
    const T* pb = static_cast<const T*>(b.raw_data());
    bool* po = static_cast<bool*>(out.raw_data());
    if (a.numel() == n && b.numel() == n) {
      LaunchMap("equal", n, EqualFn{}, po, pa, pb);
    } else {
      LaunchBroadcast("equal", shape, EqualFn{}, po, {a.shape(), b.shape()}, pa, pb);
    }
    return out;
  });
}

}  // namespace tessel::cuda
