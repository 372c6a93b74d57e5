#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "ops/cuda/adamw_math.cuh"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/nn_kernels.h"

namespace tessel::cuda {
namespace {

bool Aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}
bool Aligned16(const void* p) { return Aligned(p, 16); }

// ------------------------------------------------------------------ dtypes

// Floating elements are computed on in float: loaded and converted, and
// rounded to nearest even where stored.
template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T FromFloat(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

// Four elements as one aligned vector access (8 bytes for the 2-byte types).
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

bool IsFloat(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

// Calls fn(T{}) with T the CUDA type of a floating dtype (checked before).
template <typename Fn>
void VisitFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kBFloat16:
      return fn(__nv_bfloat16{});
    case DType::kFloat16:
      return fn(__half{});
    default:
      return fn(float{});
  }
}

// Kernels that only move elements copy them as unsigned units of their size
// (bit for bit; the zeros they write are +0 in every floating dtype).
template <typename Fn>
void VisitBits(DType dtype, Fn&& fn) {
  if (ElementSize(dtype) == 2)
    fn(uint16_t{});
  else
    fn(uint32_t{});
}

// ---------------------------------------------------------------- dropout

// Word i (0..3) of a Philox block, selected in registers (an indexed local
// array would go through local memory).
__device__ __forceinline__ uint32_t Word(const uint32_t (&c)[4], uint32_t i) {
  return i == 0 ? c[0] : i == 1 ? c[1] : i == 2 ? c[2] : c[3];
}

__device__ __forceinline__ void PhiloxBlock(uint64_t block, uint32_t k0, uint32_t k1, uint32_t (&c)[4]) {
  c[0] = static_cast<uint32_t>(block);
  c[1] = static_cast<uint32_t>(block >> 32);
  c[2] = 0;
  c[3] = 0;
  PhiloxRounds10(c, k0, k1);
}

// Keeps element `pos` iff Uniform(pos) >= p. Uniform is (bits >> 8) / 2^24
// exactly, so comparing the 24 bits with ceil(p * 2^24) decides as the CPU's
// float-to-double comparison does, without double arithmetic.
struct DropoutParams {
  const int64_t* offset;  // on the device: the layer's stream position (ops/defs/rng_counter.cc)
  uint32_t k0, k1;
  uint32_t threshold;
  float scale;
};

// Four consecutive elements per thread whose logical positions are
// consecutive too (a local tensor, or a shard whose rows hold multiples of
// four): they span at most two Philox blocks instead of four. kSharded maps
// the local index to the logical one; kVec loads and stores four elements
// at once (float4 for f32).
template <typename T, bool kSharded, bool kVec>
__global__ void Dropout4Kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n, StridedIndexer ix,
                               DropoutParams prm) {
  const int64_t groups = (n + 3) / 4;
  TESSEL_CUDA_GRID_LOOP(g, groups) {
    const int64_t i0 = g * 4;
    const uint64_t pos = static_cast<uint64_t>(*prm.offset) + static_cast<uint64_t>(kSharded ? ix(i0) : i0);
    const uint32_t lane = static_cast<uint32_t>(pos % 4);
    uint32_t lo[4], hi[4] = {0, 0, 0, 0};
    PhiloxBlock(pos / 4, prm.k0, prm.k1, lo);
    if (lane != 0) PhiloxBlock(pos / 4 + 1, prm.k0, prm.k1, hi);
    float v[4];
    if constexpr (kVec && std::is_same_v<T, float>) {
      const float4 f = reinterpret_cast<const float4*>(x)[g];
      v[0] = f.x;
      v[1] = f.y;
      v[2] = f.z;
      v[3] = f.w;
    } else if constexpr (kVec) {
      const Vec4<T> f = reinterpret_cast<const Vec4<T>*>(x)[g];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = ToFloat(f.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = i0 + k < n ? ToFloat(x[i0 + k]) : 0.0f;
    }
#pragma unroll
    for (uint32_t k = 0; k < 4; ++k) {
      const uint32_t l = lane + k;
      const uint32_t bits = l < 4 ? Word(lo, l) : Word(hi, l - 4);
      v[k] = (bits >> 8) >= prm.threshold ? v[k] * prm.scale : 0.0f;
    }
    if constexpr (kVec && std::is_same_v<T, float>) {
      reinterpret_cast<float4*>(y)[g] = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (kVec) {
      Vec4<T> f;
#pragma unroll
      for (int k = 0; k < 4; ++k) f.v[k] = FromFloat<T>(v[k]);
      reinterpret_cast<Vec4<T>*>(y)[g] = f;
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i0 + k < n) y[i0 + k] = FromFloat<T>(v[k]);
    }
  }
}

// One element per thread: a shard whose rows do not hold multiples of four.
template <typename T>
__global__ void Dropout1Kernel(T* __restrict__ y, const T* __restrict__ x, int64_t n, StridedIndexer ix,
                               DropoutParams prm) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const uint64_t pos = static_cast<uint64_t>(*prm.offset) + static_cast<uint64_t>(ix(i));
    uint32_t c[4];
    PhiloxBlock(pos / 4, prm.k0, prm.k1, c);
    y[i] = FromFloat<T>(
        (Word(c, static_cast<uint32_t>(pos % 4)) >> 8) >= prm.threshold ? ToFloat(x[i]) * prm.scale : 0.0f);
  }
}

// -------------------------------------------------------------- embedding

// U is an opaque copy unit of the row (uint4 when rows and pointers allow
// 16 bytes); h and n are counted in units.
template <typename U>
__global__ void EmbeddingKernel(U* __restrict__ out, const U* __restrict__ table,
                                const int64_t* __restrict__ ids, int64_t n, int64_t h, int64_t rows,
                                int64_t vocab_begin) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const int64_t row = i / h, c = i - row * h;
    const int64_t r = ids[row] - vocab_begin;
    out[i] = r >= 0 && r < rows ? table[r * h + c] : U{};
  }
}

// Adds into f32: the table itself for f32, a scratch table for the 2-byte
// types (atomics on those would round every partial sum).
template <typename T>
__global__ void EmbeddingGradKernel(float* __restrict__ out, const T* __restrict__ dy,
                                    const int64_t* __restrict__ ids, int64_t n, int64_t h, int64_t rows,
                                    int64_t vocab_begin, int64_t padding_idx) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const int64_t row = i / h, c = i - row * h;
    const int64_t r = ids[row] - vocab_begin;
    if (r >= 0 && r < rows && ids[row] != padding_idx) atomicAdd(out + r * h + c, ToFloat(dy[i]));
  }
}

// out = in rounded to T, four elements per thread (n counts groups of four
// when kVec, elements otherwise).
template <typename T, bool kVec>
__global__ void RoundKernel(T* __restrict__ out, const float* __restrict__ in, int64_t n) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    if constexpr (kVec) {
      const float4 f = reinterpret_cast<const float4*>(in)[i];
      Vec4<T> o;
      o.v[0] = FromFloat<T>(f.x);
      o.v[1] = FromFloat<T>(f.y);
      o.v[2] = FromFloat<T>(f.z);
      o.v[3] = FromFloat<T>(f.w);
      reinterpret_cast<Vec4<T>*>(out)[i] = o;
    } else {
      out[i] = FromFloat<T>(in[i]);
    }
  }
}

// ------------------------------------------------------------------- pick

// U: the element's bits (uint32_t for f32, uint16_t for bf16 and f16).
template <typename U>
__global__ void PickKernel(U* __restrict__ out, const U* __restrict__ x, const int64_t* __restrict__ labels,
                           int64_t n, int64_t c, int64_t class_begin, int64_t ignore_index) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const int64_t y = labels[i], j = y - class_begin;
    out[i] = y != ignore_index && j >= 0 && j < c ? x[i * c + j] : U{};
  }
}

// Scatters into zeros: one element per row, so no two threads collide.
template <typename U>
__global__ void PickGradKernel(U* __restrict__ out, const U* __restrict__ dy,
                               const int64_t* __restrict__ labels, int64_t n, int64_t columns,
                               int64_t class_begin, int64_t ignore_index) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    const int64_t y = labels[i], j = y - class_begin;
    if (y != ignore_index && j >= 0 && j < columns) out[i * columns + j] = dy[i];
  }
}

// --------------------------------------------------------------- patchify

struct PatchGeometry {
  int64_t c, h, w, p, ph, pw;
};

// Each thread writes one patch element (coalesced) and reads its pixel; U
// is the element's bits.
template <typename U>
__global__ void PatchifyKernel(U* __restrict__ out, const U* __restrict__ x, int64_t n, PatchGeometry s) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    int64_t o = i;
    const int64_t kx = o % s.p;
    o /= s.p;
    const int64_t ky = o % s.p;
    o /= s.p;
    const int64_t ci = o % s.c;
    o /= s.c;
    const int64_t px = o % s.pw;
    o /= s.pw;
    const int64_t py = o % s.ph;
    const int64_t bi = o / s.ph;
    out[i] = x[((bi * s.c + ci) * s.h + py * s.p + ky) * s.w + px * s.p + kx];
  }
}

// Each thread writes one pixel (coalesced) and reads its patch element.
template <typename U>
__global__ void UnpatchifyKernel(U* __restrict__ out, const U* __restrict__ patches, int64_t n,
                                 PatchGeometry s) {
  TESSEL_CUDA_GRID_LOOP(i, n) {
    int64_t o = i;
    const int64_t xw = o % s.w;
    o /= s.w;
    const int64_t yh = o % s.h;
    o /= s.h;
    const int64_t ci = o % s.c;
    const int64_t bi = o / s.c;
    const int64_t py = yh / s.p, ky = yh - py * s.p, px = xw / s.p, kx = xw - px * s.p;
    out[i] = patches[((bi * s.ph + py) * s.pw + px) * (s.c * s.p * s.p) + (ci * s.p + ky) * s.p + kx];
  }
}

// ------------------------------------------------------------- optimizers

// Loads and stores kWidth consecutive floats (kWidth 4: one float4).
template <int kWidth>
__device__ __forceinline__ void Load(const float* p, int64_t g, float (&v)[kWidth]) {
  if constexpr (kWidth == 4) {
    const float4 f = reinterpret_cast<const float4*>(p)[g];
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
  } else {
    v[0] = p[g];
  }
}
template <int kWidth>
__device__ __forceinline__ void Store(float* p, int64_t g, const float (&v)[kWidth]) {
  if constexpr (kWidth == 4) {
    reinterpret_cast<float4*>(p)[g] = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    p[g] = v[0];
  }
}

__global__ void CountStepKernel(int64_t* step) { ++*step; }

// The CPU's AdamW arithmetic (ops/cuda/adamw_math.cuh). n counts groups of
// kWidth floats.
template <int kWidth>
__global__ void AdamWKernel(float* __restrict__ param, const float* __restrict__ grad,
                            float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, int64_t n,
                            const int64_t* __restrict__ step, const float* __restrict__ lr, double beta1,
                            double beta2, double eps, double weight_decay) {
  // Once per block, read from the device so a captured step sees the
  // current values.
  __shared__ AdamWCoef coef;
  if (threadIdx.x == 0) coef = MakeAdamWCoef(*lr, *step, beta1, beta2, weight_decay);
  __syncthreads();
  const AdamWCoef c = coef;
  TESSEL_CUDA_GRID_LOOP(i, n) {
    float p[kWidth], g[kWidth], m[kWidth], v[kWidth];
    Load(param, i, p);
    Load(grad, i, g);
    Load(exp_avg, i, m);
    Load(exp_avg_sq, i, v);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) AdamWElement(p[k], g[k], m[k], v[k], c, beta1, beta2, eps);
    Store(param, i, p);
    Store(exp_avg, i, m);
    Store(exp_avg_sq, i, v);
  }
}

template <int kWidth>
__global__ void SgdKernel(float* __restrict__ param, const float* __restrict__ grad,
                          float* __restrict__ buffer, int64_t n, double lr, double momentum,
                          double weight_decay, bool restart) {
  const bool plain = momentum == 0;
  TESSEL_CUDA_GRID_LOOP(i, n) {
    float p[kWidth], g[kWidth], b[kWidth];
    Load(param, i, p);
    Load(grad, i, g);
    if (!restart) Load(buffer, i, b);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const double d = __dadd_rn(g[k], __dmul_rn(weight_decay, p[k]));
      b[k] = static_cast<float>(restart ? d : __dadd_rn(__dmul_rn(momentum, b[k]), d));
      p[k] = static_cast<float>(__dadd_rn(p[k], -__dmul_rn(lr, plain ? d : static_cast<double>(b[k]))));
    }
    Store(param, i, p);
    Store(buffer, i, b);
  }
}

}  // namespace

Tensor Dropout(const Tensor& x, double p, uint64_t seed, const Tensor& offset,
               const std::vector<int64_t>& box_begin, const std::vector<int64_t>& logical_shape) {
  TESSEL_CHECK(IsFloat(x.dtype())) << "dropout supports f32, bf16 and f16, got " << x.dtype();
  TESSEL_CHECK(offset.dtype() == DType::kInt64 && offset.numel() == 1 && offset.device() == x.device())
      << "dropout's offset must be an i64 scalar on " << x.device() << "; got " << offset.ToString();
  TESSEL_CHECK(p >= 0 && p < 1) << "dropout probability " << p << " must be in [0, 1)";
  SetDevice(x.device());
  const Shape& shape = x.shape();
  const int64_t nd = shape.ndim(), n = shape.numel();
  TESSEL_CHECK(static_cast<int64_t>(box_begin.size()) == nd &&
               static_cast<int64_t>(logical_shape.size()) == nd)
      << "dropout of " << shape << " needs its box's begin and its logical shape of rank " << nd << "; got "
      << box_begin.size() << " and " << logical_shape.size() << " dimensions";
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  if (n == 0) return out;
  DropoutParams prm;
  prm.offset = static_cast<const int64_t*>(offset.raw_data());
  prm.k0 = static_cast<uint32_t>(seed);
  prm.k1 = static_cast<uint32_t>(seed >> 32);
  prm.threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  prm.scale = static_cast<float>(1.0 / (1.0 - p));

  bool sharded = false;
  for (int64_t d = 0; d < nd; ++d) sharded |= box_begin[d] != 0 || shape.dims()[d] != logical_shape[d];
  StridedIndexer ix;  // local flat index -> logical flat index (unused for a whole tensor)
  if (sharded) {
    TESSEL_CHECK(nd <= StridedIndexer::kMaxDims) << "CUDA dropout of a shard takes at most "
                                                 << StridedIndexer::kMaxDims << " dimensions, got " << shape;
    const std::vector<int64_t> strides = Shape(logical_shape).ContiguousStrides();
    ix.ndim = static_cast<int>(nd);
    for (int64_t d = 0; d < nd; ++d) {
      ix.dims[d] = shape.dims()[d];
      ix.strides[d] = strides[d];
      ix.base += box_begin[d] * strides[d];
    }
  }
  VisitFloat(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* in = static_cast<const T*>(x.raw_data());
    T* y = static_cast<T*>(out.raw_data());
    const bool vec = n % 4 == 0 && Aligned(in, sizeof(Vec4<T>)) && Aligned(y, sizeof(Vec4<T>));
    const unsigned blocks = Blocks((n + 3) / 4);
    if (sharded && shape.dims()[nd - 1] % 4 != 0) {
      Dropout1Kernel<T><<<Blocks(n), kThreads, 0, CurrentStream()>>>(y, in, n, ix, prm);
    } else if (sharded) {
      if (vec)
        Dropout4Kernel<T, true, true><<<blocks, kThreads, 0, CurrentStream()>>>(y, in, n, ix, prm);
      else
        Dropout4Kernel<T, true, false><<<blocks, kThreads, 0, CurrentStream()>>>(y, in, n, ix, prm);
    } else {
      if (vec)
        Dropout4Kernel<T, false, true><<<blocks, kThreads, 0, CurrentStream()>>>(y, in, n, ix, prm);
      else
        Dropout4Kernel<T, false, false><<<blocks, kThreads, 0, CurrentStream()>>>(y, in, n, ix, prm);
    }
  });
  CheckLaunch("DropoutKernel");
  return out;
}

__global__ void AdvanceCounterKernel(int64_t* counter, int64_t by) { *counter += by; }

void AdvanceCounter(const Tensor& counter, int64_t by) {
  TESSEL_CHECK(counter.dtype() == DType::kInt64 && counter.numel() == 1)
      << "a random-stream counter is an i64 scalar; got " << counter.ToString();
  SetDevice(counter.device());
  AdvanceCounterKernel<<<1, 1, 0, CurrentStream()>>>(static_cast<int64_t*>(counter.raw_data()), by);
  CheckLaunch("AdvanceCounterKernel");
}

Tensor Embedding(const Tensor& table, const Tensor& ids, int64_t vocab_begin) {
  TESSEL_CHECK(IsFloat(table.dtype()) && table.ndim() == 2 && ids.dtype() == DType::kInt64)
      << "embedding needs an f32, bf16 or f16 table [V, H] and i64 ids; got " << table.ToString() << " and "
      << ids.ToString();
  SetDevice(table.device());
  const int64_t rows = table.shape()[0], h = table.shape()[1];
  std::vector<int64_t> dims = ids.shape().dims();
  dims.push_back(h);
  Tensor out = Tensor::Empty(Shape(dims), table.dtype(), table.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const int64_t* id = static_cast<const int64_t*>(ids.raw_data());
  // Rows are copied in the widest unit (up to 16 bytes) dividing a row and
  // both pointers' alignments.
  const int64_t row_bytes = h * static_cast<int64_t>(ElementSize(table.dtype()));
  int64_t unit = 16;
  while (row_bytes % unit != 0 || !Aligned(table.raw_data(), unit) || !Aligned(out.raw_data(), unit))
    unit /= 2;
  const int64_t hu = row_bytes / unit, nu = n / h * hu;
  auto launch = [&](auto zero) {
    using U = decltype(zero);
    EmbeddingKernel<U><<<Blocks(nu), kThreads, 0, CurrentStream()>>>(static_cast<U*>(out.raw_data()),
                                                                     static_cast<const U*>(table.raw_data()),
                                                                     id, nu, hu, rows, vocab_begin);
  };
  switch (unit) {
    case 16:
      launch(uint4{});
      break;
    case 8:
      launch(uint2{});
      break;
    case 4:
      launch(uint32_t{});
      break;
    default:
      launch(uint16_t{});
  }
  CheckLaunch("EmbeddingKernel");
  return out;
}

Tensor EmbeddingGrad(const Tensor& ids, const Tensor& dy, int64_t vocab_begin, int64_t rows,
                     int64_t padding_idx) {
  const int64_t h = dy.shape()[-1];
  // The CPU reads as the shapes say; on the device a mismatch would be an
  // out-of-bounds read, so it is refused.
  TESSEL_CHECK(ids.dtype() == DType::kInt64 && IsFloat(dy.dtype()) && ids.numel() * h == dy.numel())
      << "embedding_grad needs i64 ids and an f32, bf16 or f16 gradient of their shape plus the hidden size; "
         "got "
      << ids.ToString() << " and " << dy.ToString();
  SetDevice(dy.device());
  Tensor out = Tensor::Empty({rows, h}, dy.dtype(), dy.device());
  const int64_t n = dy.numel();
  const int64_t* id = static_cast<const int64_t*>(ids.raw_data());
  if (dy.dtype() == DType::kFloat32) {
    Zero(out);
    if (n == 0 || out.numel() == 0) return out;
    EmbeddingGradKernel<float><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
        static_cast<float*>(out.raw_data()), static_cast<const float*>(dy.raw_data()), id, n, h, rows,
        vocab_begin, padding_idx);
    CheckLaunch("EmbeddingGradKernel");
    return out;
  }
  if (n == 0 || out.numel() == 0) {
    Zero(out);
    return out;
  }
  Tensor sum = Tensor::Empty({rows, h}, DType::kFloat32, dy.device());
  Zero(sum);
  float* acc = static_cast<float*>(sum.raw_data());
  const int64_t m = out.numel();
  VisitFloat(dy.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, float>) {  // f32 is handled above
      EmbeddingGradKernel<T><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
          acc, static_cast<const T*>(dy.raw_data()), id, n, h, rows, vocab_begin, padding_idx);
      CheckLaunch("EmbeddingGradKernel");
      T* o = static_cast<T*>(out.raw_data());
      if (m % 4 == 0 && Aligned(acc, 16) && Aligned(o, sizeof(Vec4<T>)))
        RoundKernel<T, true><<<Blocks(m / 4), kThreads, 0, CurrentStream()>>>(o, acc, m / 4);
      else
        RoundKernel<T, false><<<Blocks(m), kThreads, 0, CurrentStream()>>>(o, acc, m);
      CheckLaunch("RoundKernel");
    }
  });
  return out;
}

Tensor Pick(const Tensor& x, const Tensor& labels, int64_t class_begin, int64_t ignore_index) {
  TESSEL_CHECK(IsFloat(x.dtype()) && x.ndim() == 2 && labels.dtype() == DType::kInt64 &&
               labels.numel() == x.shape()[0])
      << "pick needs x [N, C] (f32, bf16 or f16) and i64 labels [N]; got " << x.ToString() << " and "
      << labels.ToString();
  SetDevice(x.device());
  const int64_t n = x.shape()[0], c = x.shape()[1];
  Tensor out = Tensor::Empty({n}, x.dtype(), x.device());
  if (n == 0) return out;
  VisitBits(x.dtype(), [&](auto zero) {
    using U = decltype(zero);
    PickKernel<U><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
        static_cast<U*>(out.raw_data()), static_cast<const U*>(x.raw_data()),
        static_cast<const int64_t*>(labels.raw_data()), n, c, class_begin, ignore_index);
  });
  CheckLaunch("PickKernel");
  return out;
}

Tensor PickGrad(const Tensor& labels, const Tensor& dy, int64_t class_begin, int64_t columns,
                int64_t ignore_index) {
  const int64_t n = labels.numel();
  TESSEL_CHECK(labels.dtype() == DType::kInt64 && IsFloat(dy.dtype()) && dy.numel() == n)
      << "pick_grad needs i64 labels [N] and an f32, bf16 or f16 gradient [N]; got " << labels.ToString()
      << " and " << dy.ToString();
  SetDevice(dy.device());
  Tensor out = Tensor::Empty({n, columns}, dy.dtype(), dy.device());
  Zero(out);
  if (out.numel() == 0) return out;
  VisitBits(dy.dtype(), [&](auto zero) {
    using U = decltype(zero);
    PickGradKernel<U><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
        static_cast<U*>(out.raw_data()), static_cast<const U*>(dy.raw_data()),
        static_cast<const int64_t*>(labels.raw_data()), n, columns, class_begin, ignore_index);
  });
  CheckLaunch("PickGradKernel");
  return out;
}

Tensor Patchify(const Tensor& x, int64_t patch) {
  const Shape& s = x.shape();
  TESSEL_CHECK(IsFloat(x.dtype()) && s.ndim() == 4 && patch > 0 && s[2] % patch == 0 && s[3] % patch == 0)
      << "patchify needs f32, bf16 or f16 images [B, C, H, W] with H and W divisible by the patch size "
      << patch << "; got " << x.ToString();
  SetDevice(x.device());
  Tensor out =
      Tensor::Empty({s[0], (s[2] / patch) * (s[3] / patch), s[1] * patch * patch}, x.dtype(), x.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const PatchGeometry g{s[1], s[2], s[3], patch, s[2] / patch, s[3] / patch};
  VisitBits(x.dtype(), [&](auto zero) {
    using U = decltype(zero);
    PatchifyKernel<U><<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<U*>(out.raw_data()),
                                                                   static_cast<const U*>(x.raw_data()), n, g);
  });
  CheckLaunch("PatchifyKernel");
  return out;
}

Tensor Unpatchify(const Tensor& patches, const Shape& image_shape, int64_t patch) {
  const Shape& s = image_shape;
  // The CPU trusts the shapes; on the device a mismatch would read out of
  // bounds, so it is refused.
  TESSEL_CHECK(IsFloat(patches.dtype()) && s.ndim() == 4 && patch > 0 && s[2] % patch == 0 &&
               s[3] % patch == 0 && patches.numel() == s.numel())
      << "unpatchify needs f32, bf16 or f16 patches of images " << s
      << " with H and W divisible by the patch size " << patch << "; got " << patches.ToString();
  SetDevice(patches.device());
  Tensor out = Tensor::Empty(s, patches.dtype(), patches.device());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const PatchGeometry g{s[1], s[2], s[3], patch, s[2] / patch, s[3] / patch};
  VisitBits(patches.dtype(), [&](auto zero) {
    using U = decltype(zero);
    UnpatchifyKernel<U><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
        static_cast<U*>(out.raw_data()), static_cast<const U*>(patches.raw_data()), n, g);
  });
  CheckLaunch("UnpatchifyKernel");
  return out;
}

void AdamWUpdate(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const Tensor& step, const Tensor& lr, double beta1, double beta2, double eps,
                 double weight_decay) {
  // The master weights and their states are f32 whatever the model's dtype.
  for (const Tensor* t : {&param, &grad, &exp_avg, &exp_avg_sq, &lr}) {
    TESSEL_CHECK(t->dtype() == DType::kFloat32)
        << "adamw_update needs f32 param, grad, states and lr; got " << t->ToString();
  }
  TESSEL_CHECK(step.dtype() == DType::kInt64) << "adamw_update's step must be i64; got " << step.ToString();
  SetDevice(param.device());
  // The step is counted on the device by a kernel of its own: it orders the
  // increment before every block of the update reads it.
  CountStepKernel<<<1, 1, 0, CurrentStream()>>>(static_cast<int64_t*>(step.raw_data()));
  CheckLaunch("CountStepKernel");
  const int64_t n = param.numel();
  if (n == 0) return;
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* m = static_cast<float*>(exp_avg.raw_data());
  float* v = static_cast<float*>(exp_avg_sq.raw_data());
  const int64_t* s = static_cast<const int64_t*>(step.raw_data());
  const float* l = static_cast<const float*>(lr.raw_data());
  if (n % 4 == 0 && Aligned16(p) && Aligned16(g) && Aligned16(m) && Aligned16(v)) {
    AdamWKernel<4><<<Blocks(n / 4), kThreads, 0, CurrentStream()>>>(p, g, m, v, n / 4, s, l, beta1, beta2,
                                                                    eps, weight_decay);
  } else {
    AdamWKernel<1>
        <<<Blocks(n), kThreads, 0, CurrentStream()>>>(p, g, m, v, n, s, l, beta1, beta2, eps, weight_decay);
  }
  CheckLaunch("AdamWKernel");
}

void SgdUpdate(const Tensor& param, const Tensor& grad, const Tensor& buffer, double lr, double momentum,
               double weight_decay, bool first) {
  for (const Tensor* t : {&param, &grad, &buffer}) {
    TESSEL_CHECK(t->dtype() == DType::kFloat32)
        << "sgd_update needs f32 param, grad and buffer; got " << t->ToString();
  }
  SetDevice(param.device());
  const int64_t n = param.numel();
  if (n == 0) return;
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* b = static_cast<float*>(buffer.raw_data());
  const bool restart = first || momentum == 0;
  if (n % 4 == 0 && Aligned16(p) && Aligned16(g) && Aligned16(b)) {
    SgdKernel<4><<<Blocks(n / 4), kThreads, 0, CurrentStream()>>>(p, g, b, n / 4, lr, momentum, weight_decay,
                                                                  restart);
  } else {
    SgdKernel<1>
        <<<Blocks(n), kThreads, 0, CurrentStream()>>>(p, g, b, n, lr, momentum, weight_decay, restart);
  }
  CheckLaunch("SgdKernel");
}

}  // namespace tessel::cuda
