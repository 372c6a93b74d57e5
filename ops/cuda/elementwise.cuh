// Device helpers shared by the elementwise, reduction and where/cast
// kernels: vectorised flat maps over same-shape operands, and an indexer
// for several operands read at broadcast (or permuted) strides whose
// adjacent dimensions are merged where every operand steps through them
// contiguously, so the common cases (a bias row, a scalar) cost at most
// one division per element; and the 16-bit float types, which kernels load
// as float and store rounded to nearest even. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cuda/cuda_util.cuh"

namespace tessel::cuda {

// Names a type without constructing one (for the dtype visitors).
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the device type of a floating dtype: float,
// __half or __nv_bfloat16; throws naming `op` for any other dtype.
template <typename Fn>
decltype(auto) VisitFloat(const char* op, DType dtype, Fn&& fn) {
  TESSEL_CHECK(IsFloating(dtype)) << op << " supports f32, bf16 and f16 on CUDA; got " << dtype;
  switch (dtype) {
    case DType::kFloat32:
      return fn(TypeTag<float>{});
    case DType::kFloat16:
      return fn(TypeTag<__half>{});
    default:
      return fn(TypeTag<__nv_bfloat16>{});
  }
}

// Loads and stores of the floating types: kernels compute in float whatever
// the storage (for f32 both are the identity, so the f32 path is unchanged).
__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromF32(float v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    static_assert(std::is_same_v<T, float>, "FromF32 stores float, __half or __nv_bfloat16");
    return v;
  }
}

// V elements moved with one (or two) vector loads; V * sizeof(T) must be
// the pointer's alignment, which LaunchMap checks before using it.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}

template <int V, typename T>
__device__ __forceinline__ void StorePack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

template <int V, typename Fn, typename O, typename... In>
__device__ __forceinline__ void ApplyPack(const Fn& fn, Pack<O, V>& out, const Pack<In, V>&... in) {
#pragma unroll
  for (int k = 0; k < V; ++k) out.v[k] = fn(in.v[k]...);
}

// out[i] = fn(in[i]...) over n elements: V at a time, then the tail.
template <int V, typename Fn, typename O, typename... In>
__global__ void MapKernel(int64_t n, Fn fn, O* __restrict__ out, const In* __restrict__... in) {
  const int64_t nv = n / V;
  TESSEL_CUDA_GRID_LOOP(i, nv) {
    Pack<O, V> o;
    ApplyPack<V>(fn, o, LoadPack<V>(in + i * V)...);
    StorePack<V>(out + i * V, o);
  }
  for (int64_t i = nv * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = fn(in[i]...);
}

template <typename T>
inline bool PackAligned(const T* p, int v) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0;
}

// Elements per pack: 16 bytes of the widest operand when it is 2 bytes
// wide (bf16, f16), else 4 (16 bytes of f32).
template <typename O, typename... In>
constexpr int PackWidth() {
  return std::max({sizeof(O), sizeof(In)...}) == 2 ? 8 : 4;
}

// Runs MapKernel on the current stream, with packs of PackWidth elements
// when every pointer allows them.
template <typename Fn, typename O, typename... In>
void LaunchMap(const char* name, int64_t n, Fn fn, O* out, const In*... in) {
  if (n <= 0) return;
  constexpr int kVec = PackWidth<O, In...>();
  if (n >= kVec && PackAligned(out, kVec) && (PackAligned(in, kVec) && ...)) {
    MapKernel<kVec><<<Blocks((n + kVec - 1) / kVec), kThreads, 0, CurrentStream()>>>(n, fn, out, in...);
  } else {
    MapKernel<1><<<Blocks(n), kThreads, 0, CurrentStream()>>>(n, fn, out, in...);
  }
  CheckLaunch(name);
}

// Element offsets of N operands for a flat row-major index of the output.
template <int N>
struct MultiIndexer {
  static constexpr int kMaxDims = StridedIndexer::kMaxDims;
  int ndim = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // I is uint32_t when every tensor has fewer than 2^31 elements: 32-bit
  // division is several times cheaper than 64-bit.
  template <typename I>
  __device__ __forceinline__ void operator()(I flat, I (&offsets)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) offsets[k] = 0;
    for (int d = ndim - 1; d > 0; --d) {
      const I size = static_cast<I>(dims[d]);
      const I q = flat / size;
      const I r = flat - q * size;
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += r * static_cast<I>(strides[k][d]);
      flat = q;
    }
    // The outermost dimension needs no division: flat is already its index.
    if (ndim > 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += flat * static_cast<I>(strides[k][0]);
    }
  }
};

// Row-major strides of `in` read as broadcast to `out` (0 where broadcast).
inline std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out) {
  std::vector<int64_t> strides(out.ndim(), 0);
  const int64_t off = out.ndim() - in.ndim();
  int64_t stride = 1;
  for (int64_t i = in.ndim() - 1; i >= 0; --i) {
    if (in.dims()[i] != 1) {
      TESSEL_CHECK(in.dims()[i] == out.dims()[i + off]) << "cannot broadcast " << in << " to " << out;
      strides[i + off] = stride;
    }
    stride *= in.dims()[i];
  }
  return strides;
}

// The indexer over `dims` with strides[k] per dimension for operand k;
// size-1 dimensions are dropped and neighbours merged where every operand
// allows it.
template <int N>
MultiIndexer<N> MakeMultiIndexer(const std::vector<int64_t>& dims,
                                 const std::array<std::vector<int64_t>, N>& strides) {
  std::vector<int64_t> merged_dims;
  std::vector<std::array<int64_t, N>> merged_strides;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    bool merge = !merged_dims.empty();
    for (int k = 0; k < N && merge; ++k) merge = merged_strides.back()[k] == strides[k][d] * dims[d];
    if (merge) {
      merged_dims.back() *= dims[d];
      for (int k = 0; k < N; ++k) merged_strides.back()[k] = strides[k][d];
      continue;
    }
    merged_dims.push_back(dims[d]);
    std::array<int64_t, N> s;
    for (int k = 0; k < N; ++k) s[k] = strides[k][d];
    merged_strides.push_back(s);
  }
  MultiIndexer<N> ix;
  TESSEL_CHECK(merged_dims.size() <= static_cast<size_t>(MultiIndexer<N>::kMaxDims))
      << "CUDA kernels take at most " << MultiIndexer<N>::kMaxDims << " non-mergeable dimensions, got "
      << Shape(dims);
  ix.ndim = static_cast<int>(merged_dims.size());
  for (int d = 0; d < ix.ndim; ++d) {
    ix.dims[d] = merged_dims[d];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = merged_strides[d][k];
  }
  return ix;
}

template <typename Fn, typename I, int N, size_t... K, typename... In>
__device__ __forceinline__ auto CallAt(const Fn& fn, const I (&off)[N], const I (&step)[N], I k,
                                       std::index_sequence<K...>, const In*... in) {
  return fn(in[off[K] + k * step[K]]...);
}

// out[i] = fn(in_k[offset_k(i)]...) for operands read at the indexer's
// strides. V consecutive outputs lie in one innermost row (the launcher
// checks), so one offset computation serves all V of them.
template <int V, typename I, int N, typename Fn, typename O, typename... In>
__global__ void IndexedMapKernel(I n, MultiIndexer<N> ix, Fn fn, O* __restrict__ out,
                                 const In* __restrict__... in) {
  I step[N];
#pragma unroll
  for (int k = 0; k < N; ++k) step[k] = ix.ndim > 0 ? static_cast<I>(ix.strides[k][ix.ndim - 1]) : 0;
  const I groups = n / V;
  for (I g = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<I>(gridDim.x) * blockDim.x) {
    I off[N];
    ix(g * V, off);
    Pack<O, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k)
      o.v[k] = CallAt(fn, off, step, static_cast<I>(k), std::make_index_sequence<N>{}, in...);
    StorePack<V>(out + g * V, o);
  }
}

// Whether 32-bit index arithmetic covers every element (with room for the
// grid stride past the end).
inline bool Fits32(int64_t n) { return n < (int64_t{1} << 31); }

// Runs fn over the output of `out_shape`, reading each operand as broadcast
// from its own shape.
template <typename Fn, typename O, typename... In>
void LaunchBroadcast(const char* name, const Shape& out_shape, Fn fn, O* out,
                     const std::array<Shape, sizeof...(In)>& in_shapes, const In*... in) {
  constexpr int N = sizeof...(In);
  const int64_t n = out_shape.numel();
  if (n <= 0) return;
  std::array<std::vector<int64_t>, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = BroadcastStrides(in_shapes[k], out_shape);
  MultiIndexer<N> ix = MakeMultiIndexer<N>(out_shape.dims(), strides);
  constexpr int kVec = PackWidth<O, In...>();
  const bool vec = ix.ndim > 0 && ix.dims[ix.ndim - 1] % kVec == 0 && PackAligned(out, kVec);
  if (vec && Fits32(n)) {
    IndexedMapKernel<kVec, uint32_t, N>
        <<<Blocks(n / kVec), kThreads, 0, CurrentStream()>>>(static_cast<uint32_t>(n), ix, fn, out, in...);
  } else if (vec) {
    IndexedMapKernel<kVec, int64_t, N>
        <<<Blocks(n / kVec), kThreads, 0, CurrentStream()>>>(n, ix, fn, out, in...);
  } else if (Fits32(n)) {
    IndexedMapKernel<1, uint32_t, N>
        <<<Blocks(n), kThreads, 0, CurrentStream()>>>(static_cast<uint32_t>(n), ix, fn, out, in...);
  } else {
    IndexedMapKernel<1, int64_t, N><<<Blocks(n), kThreads, 0, CurrentStream()>>>(n, ix, fn, out, in...);
  }
  CheckLaunch(name);
}

}  // namespace tessel::cuda
