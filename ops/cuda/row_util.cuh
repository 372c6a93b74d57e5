// What the row-wise CUDA kernels (softmax, cross-entropy, layer norm) share:
// 16-byte vector moves of f32, bf16 and f16 as floats (ToF32 / FromF32 of
// elementwise.cuh), and warp / block all-reduces.
// Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "ops/cuda/elementwise.cuh"  // ToF32, FromF32

namespace tessel::cuda {

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T WarpAllReduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread of the block gets the result.
template <typename T, typename Op>
__device__ T BlockAllReduce(T v, T identity, Op op) {
  __shared__ T scratch[32];
  v = WarpAllReduce(v, op);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // an earlier call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpAllReduce(lane < warps ? scratch[lane] : identity, op);
}

// kVec elements moved as one 16-byte vector.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) RowPack {
  T e[kVec];
};

// kVec > 1 needs kVec * sizeof(T) == 16 and a 16-byte aligned p.
template <int kVec, typename T>
__device__ __forceinline__ void Load(const T* p, float (&v)[kVec]) {
  if constexpr (std::is_same_v<T, float> && kVec == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else if constexpr (kVec > 1) {
    static_assert(sizeof(T) * kVec == 16, "one 16-byte vector");
    const RowPack<T, kVec> t = *reinterpret_cast<const RowPack<T, kVec>*>(p);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = ToF32(t.e[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] = ToF32(p[e]);
  }
}

template <int kVec, typename T>
__device__ __forceinline__ void Store(T* p, const float (&v)[kVec]) {
  if constexpr (std::is_same_v<T, float> && kVec == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (kVec > 1) {
    static_assert(sizeof(T) * kVec == 16, "one 16-byte vector");
    RowPack<T, kVec> t;
#pragma unroll
    for (int e = 0; e < kVec; ++e) t.e[e] = FromF32<T>(v[e]);
    *reinterpret_cast<RowPack<T, kVec>*>(p) = t;
  } else {
#pragma unroll
    for (int e = 0; e < kVec; ++e) p[e] = FromF32<T>(v[e]);
  }
}

}  // namespace tessel::cuda
