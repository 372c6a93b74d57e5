#include <limits>
#include <optional>
#include <set>

#include "core/error.h"
#include "ops/cpu/broadcast.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/elementwise.cuh"
#include "ops/cuda/reduce.h"

namespace tessel::cuda {
namespace {

constexpr int kWarp = 32;
// Blocks that keep every SM of an H100 busy with a few blocks each; a
// reduction with fewer outputs than this splits its reduced extent and
// finishes with a second pass over the partial results.
constexpr int64_t kTargetBlocks = 2048;
// Column reductions: a warp reads 32 adjacent columns of a row (one
// 128-byte line), and kColRows warps of the block take interleaved rows.
constexpr int kColTile = 32;
constexpr int kColRows = 8;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Max ignores NaN like the CPU's std::max(acc, x) from -inf: a NaN never
// compares greater, so it is never taken.
template <bool kMax>
__device__ __forceinline__ double Combine(double a, double b) {
  if constexpr (kMax) {
    return a < b ? b : a;
  } else {
    return a + b;
  }
}

template <bool kMax>
__device__ __forceinline__ double Identity() {
  return kMax ? -std::numeric_limits<double>::infinity() : 0.0;
}

template <bool kMax>
__device__ __forceinline__ double WarpReduce(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = Combine<kMax>(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

// The reduction of v over a 1-D block, valid in thread 0.
template <bool kMax>
__device__ __forceinline__ double BlockReduce(double v) {
  __shared__ double warp_values[kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  v = WarpReduce<kMax>(v);
  if (lane == 0) warp_values[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / kWarp) ? warp_values[lane] : Identity<kMax>();
    v = WarpReduce<kMax>(v);
  }
  return v;
}

// Reduced elements widen to double whatever their storage (exactly).
__device__ __forceinline__ double ToF64(double v) { return v; }
template <typename T>
__device__ __forceinline__ double ToF64(T v) {
  return static_cast<double>(ToF32(v));
}

// Rows of a contiguous [rows, len] input. A loader gives the offset of a
// row once (Base) and then its elements (At).
template <typename T>
struct ContigRows {
  const T* p;
  int64_t len;
  __device__ __forceinline__ int64_t Base(int64_t row) const { return row * len; }
  __device__ __forceinline__ double At(int64_t base, int64_t j) const { return ToF64(p[base + j]); }
};

// Rows of the input viewed (permuted) as [kept..., reduced...]: a row's
// offset comes from the kept dims, its elements' from the reduced dims.
template <typename T, typename I>
struct StridedRows {
  const T* p;
  MultiIndexer<1> kept, reduced;
  __device__ __forceinline__ int64_t Base(int64_t row) const {
    I off[1];
    kept(static_cast<I>(row), off);
    return off[0];
  }
  __device__ __forceinline__ double At(int64_t base, int64_t j) const {
    I off[1];
    reduced(static_cast<I>(j), off);
    return ToF64(p[base + off[0]]);
  }
};

struct StorePartial {
  double* p;
  __device__ __forceinline__ void operator()(int64_t i, double acc) const { p[i] = acc; }
};

// Rounds to float, then (bf16, f16) to the output's type.
template <typename T>
struct StoreFinal {
  T* p;
  bool mean;
  double count;  // elements reduced into each output (the divisor of a mean)
  __device__ __forceinline__ void operator()(int64_t i, double acc) const {
    p[i] = FromF32<T>(static_cast<float>(mean ? acc / count : acc));
  }
};

// Accumulates elements [begin, end) of `row` taken `step` apart, four loads
// in flight per thread.
template <bool kMax, typename Load>
__device__ __forceinline__ double AccumulateRow(const Load& load, int64_t row, int64_t begin, int64_t end,
                                                int step) {
  double acc = Identity<kMax>();
  const int64_t base = load.Base(row);
  int64_t j = begin;
  for (; j + 3 * step < end; j += 4 * step) {
    const double v0 = load.At(base, j), v1 = load.At(base, j + step), v2 = load.At(base, j + 2 * step),
                 v3 = load.At(base, j + 3 * step);
    acc = Combine<kMax>(Combine<kMax>(Combine<kMax>(Combine<kMax>(acc, v0), v1), v2), v3);
  }
  for (; j < end; j += step) acc = Combine<kMax>(acc, load.At(base, j));
  return acc;
}

// One block per (row, split): reduces chunk `split` of the row; writes
// output blockIdx.x = row * splits + split.
template <bool kMax, typename Load, typename Store>
__global__ void RowReduceBlockKernel(Load load, Store store, int64_t len, int64_t splits, int64_t chunk) {
  const int64_t b = blockIdx.x;
  const int64_t row = b / splits, split = b - row * splits;
  const int64_t begin = split * chunk, end = min(len, begin + chunk);
  double acc = AccumulateRow<kMax>(load, row, begin + threadIdx.x, end, blockDim.x);
  acc = BlockReduce<kMax>(acc);
  if (threadIdx.x == 0) store(b, acc);
}

// One warp per row, for short rows.
template <bool kMax, typename Load, typename Store>
__global__ void RowReduceWarpKernel(Load load, Store store, int64_t rows, int64_t len) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp;
  double acc = AccumulateRow<kMax>(load, row, lane, len, kWarp);
  acc = WarpReduce<kMax>(acc);
  if (lane == 0) store(row, acc);
}

// [outer, len, inner] -> [outer, splits, inner]: block (kColTile, kColRows)
// reduces rows [split * chunk, +chunk) of kColTile x V adjacent columns,
// each thread V of them (V > 1: one 16-byte load per row, inner % V == 0).
// Each column adds its rows in the same order whatever V is.
template <bool kMax, int V, typename In, typename Store>
__global__ void ColReduceKernel(const In* __restrict__ x, Store store, int64_t len, int64_t inner,
                                int64_t tiles, int64_t splits, int64_t chunk) {
  const int64_t b = blockIdx.x;
  const int64_t tile = b % tiles, rest = b / tiles;
  const int64_t split = rest % splits, o = rest / splits;
  const int64_t col = (tile * kColTile + threadIdx.x) * V;
  const int64_t begin = split * chunk, end = min(len, begin + chunk);
  double acc[V];
#pragma unroll
  for (int e = 0; e < V; ++e) acc[e] = Identity<kMax>();
  if (col < inner) {
    const In* p = x + o * len * inner + col;
    if constexpr (V == 1) {
      int64_t r = begin + threadIdx.y;
      for (; r + 3 * kColRows < end; r += 4 * kColRows) {
        const double v0 = ToF64(p[r * inner]), v1 = ToF64(p[(r + kColRows) * inner]),
                     v2 = ToF64(p[(r + 2 * kColRows) * inner]), v3 = ToF64(p[(r + 3 * kColRows) * inner]);
        acc[0] = Combine<kMax>(Combine<kMax>(Combine<kMax>(Combine<kMax>(acc[0], v0), v1), v2), v3);
      }
      for (; r < end; r += kColRows) acc[0] = Combine<kMax>(acc[0], ToF64(p[r * inner]));
    } else {
      int64_t r = begin + threadIdx.y;
      for (; r + kColRows < end; r += 2 * kColRows) {  // two loads in flight
        const Pack<In, V> v0 = *reinterpret_cast<const Pack<In, V>*>(p + r * inner);
        const Pack<In, V> v1 = *reinterpret_cast<const Pack<In, V>*>(p + (r + kColRows) * inner);
#pragma unroll
        for (int e = 0; e < V; ++e)
          acc[e] = Combine<kMax>(Combine<kMax>(acc[e], ToF64(v0.v[e])), ToF64(v1.v[e]));
      }
      for (; r < end; r += kColRows) {
        const Pack<In, V> v0 = *reinterpret_cast<const Pack<In, V>*>(p + r * inner);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = Combine<kMax>(acc[e], ToF64(v0.v[e]));
      }
    }
  }
  __shared__ double partial[kColRows][kColTile * V];
#pragma unroll
  for (int e = 0; e < V; ++e) partial[threadIdx.y][threadIdx.x * V + e] = acc[e];
  __syncthreads();
  if (threadIdx.y == 0 && col < inner) {
#pragma unroll
    for (int e = 0; e < V; ++e) {
      double a = acc[e];
#pragma unroll
      for (int k = 1; k < kColRows; ++k) a = Combine<kMax>(a, partial[k][threadIdx.x * V + e]);
      store((o * splits + split) * inner + col + e, a);
    }
  }
}

// Scratch for partial results in double (no tensor dtype is f64: i64 has the size).
double* Scratch(Tensor* holder, int64_t n, const Device& device) {
  *holder = Tensor::Empty(Shape({n}), DType::kInt64, device);
  return static_cast<double*>(holder->raw_data());
}

// One pass over rows that each fit one block or warp.
template <bool kMax, typename Load, typename Store>
void RowReduceOnePass(const Load& load, Store store, int64_t rows, int64_t len) {
  if (len <= 1024) {
    constexpr int kWarpsPerBlock = kThreads / kWarp;
    RowReduceWarpKernel<kMax>
        <<<static_cast<unsigned>(CeilDiv(rows, kWarpsPerBlock)), kThreads, 0, CurrentStream()>>>(load, store,
                                                                                                 rows, len);
    CheckLaunch("RowReduceWarpKernel");
  } else {
    RowReduceBlockKernel<kMax>
        <<<static_cast<unsigned>(rows), kThreads, 0, CurrentStream()>>>(load, store, len, 1, len);
    CheckLaunch("RowReduceBlockKernel");
  }
}

// Reduces each of `rows` rows of `len` elements to store(row, value).
template <bool kMax, typename Load, typename T>
void RowReduce(const Load& load, StoreFinal<T> store, int64_t rows, int64_t len, const Device& device) {
  int64_t splits = 1;
  // Few long rows (a whole-tensor sum): split them so every SM gets work.
  if (len > 8192 && rows < kTargetBlocks) splits = std::min(CeilDiv(kTargetBlocks, rows), CeilDiv(len, 4096));
  if (splits <= 1) return RowReduceOnePass<kMax>(load, store, rows, len);
  const int64_t chunk = CeilDiv(len, splits);
  splits = CeilDiv(len, chunk);  // no empty chunk
  Tensor holder;
  double* partial = Scratch(&holder, rows * splits, device);
  RowReduceBlockKernel<kMax><<<static_cast<unsigned>(rows * splits), kThreads, 0, CurrentStream()>>>(
      load, StorePartial{partial}, len, splits, chunk);
  CheckLaunch("RowReduceBlockKernel");
  RowReduceOnePass<kMax>(ContigRows<double>{partial, splits}, store, rows, splits);
}

// Reduces the middle axis of a contiguous [outer, len, inner] (inner > 1).
template <bool kMax, int V, typename T>
void ColReduceWidth(const T* x, StoreFinal<T> store, int64_t outer, int64_t len, int64_t inner,
                    const Device& device) {
  const int64_t tiles = CeilDiv(inner, kColTile * V);
  const dim3 block(kColTile, kColRows);
  int64_t splits = 1;
  // Few column tiles (a bias gradient over many rows): split the rows too.
  if (len > 64 && tiles * outer < kTargetBlocks)
    splits = std::min(CeilDiv(kTargetBlocks, tiles * outer), CeilDiv(len, 32));
  if (splits <= 1) {
    ColReduceKernel<kMax, V><<<static_cast<unsigned>(tiles * outer), block, 0, CurrentStream()>>>(
        x, store, len, inner, tiles, 1, len);
    CheckLaunch("ColReduceKernel");
    return;
  }
  const int64_t chunk = CeilDiv(len, splits);
  splits = CeilDiv(len, chunk);
  Tensor holder;
  double* partial = Scratch(&holder, outer * splits * inner, device);
  ColReduceKernel<kMax, V><<<static_cast<unsigned>(tiles * outer * splits), block, 0, CurrentStream()>>>(
      x, StorePartial{partial}, len, inner, tiles, splits, chunk);
  CheckLaunch("ColReduceKernel");
  const int64_t final_tiles = CeilDiv(inner, kColTile);
  ColReduceKernel<kMax, 1><<<static_cast<unsigned>(final_tiles * outer), block, 0, CurrentStream()>>>(
      static_cast<const double*>(partial), store, splits, inner, final_tiles, 1, splits);
  CheckLaunch("ColReduceKernel");
}

// 16-byte loads where every row of columns starts aligned (the bias
// gradients of [tokens, features] activations); one element per load else.
template <bool kMax, typename T>
void ColReduce(const T* x, StoreFinal<T> store, int64_t outer, int64_t len, int64_t inner,
               const Device& device) {
  constexpr int kVec = 16 / sizeof(T);
  if (inner % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    return ColReduceWidth<kMax, kVec>(x, store, outer, len, inner, device);
  ColReduceWidth<kMax, 1>(x, store, outer, len, inner, device);
}

template <typename T>
struct FillFn {
  float value;
  __device__ T operator()() const { return FromF32<T>(value); }
};

// An output that reduces a single element, divided by a mean's divisor
// (a shard's size-1 axis, whose logical extent is larger).
template <typename T>
struct DivideFn {
  double count;
  __device__ T operator()(T v) const { return FromF32<T>(static_cast<float>(ToF64(v) / count)); }
};

struct CopyFn {
  template <typename T>
  __device__ T operator()(T v) const {
    return v;
  }
};

void CopyDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CurrentStream()), "cudaMemcpyAsync");
}

template <bool kMax, typename T>
void RunReduce(const Tensor& x, const std::set<int64_t>& reduced, StoreFinal<T> store, int64_t n_out) {
  // Drop size-1 dims and merge neighbours of the same kind: [kept, reduced, kept, ...].
  std::vector<int64_t> sizes;
  std::vector<bool> is_reduced;
  for (int64_t d = 0; d < x.ndim(); ++d) {
    const int64_t size = x.shape().dims()[d];
    if (size == 1) continue;
    const bool r = reduced.count(d) > 0;
    if (!sizes.empty() && is_reduced.back() == r) {
      sizes.back() *= size;
    } else {
      sizes.push_back(size);
      is_reduced.push_back(r);
    }
  }
  const T* px = static_cast<const T*>(x.raw_data());
  const int64_t n_in = x.numel(), len = n_in / n_out;
  const int64_t groups = static_cast<int64_t>(sizes.size());
  const int64_t reduced_groups = std::count(is_reduced.begin(), is_reduced.end(), true);
  if (reduced_groups == 0) {
    if (store.mean && store.count != 1.0)
      return LaunchMap("mean", n_in, DivideFn<T>{store.count}, store.p, px);
    return CopyDevice(store.p, px, n_in * sizeof(T));
  }
  if (reduced_groups == 1) {
    int64_t outer = 1, inner = 1, g = 0;
    for (; !is_reduced[g]; ++g) outer *= sizes[g];
    for (++g; g < groups; ++g) inner *= sizes[g];
    if (inner == 1) return RowReduce<kMax>(ContigRows<T>{px, len}, store, outer, len, x.device());
    return ColReduce<kMax>(px, store, outer, len, inner, x.device());
  }
  // Reduced axes apart from each other: read the input permuted to
  // [kept..., reduced...], so each output is a row of the view.
  std::vector<int64_t> group_strides(groups, 1);
  for (int64_t g = groups - 2; g >= 0; --g) group_strides[g] = group_strides[g + 1] * sizes[g + 1];
  std::vector<int64_t> dims[2], strides[2];  // kept, reduced
  for (int64_t g = 0; g < groups; ++g) {
    dims[is_reduced[g]].push_back(sizes[g]);
    strides[is_reduced[g]].push_back(group_strides[g]);
  }
  MultiIndexer<1> kept = MakeMultiIndexer<1>(dims[0], {strides[0]});
  MultiIndexer<1> red = MakeMultiIndexer<1>(dims[1], {strides[1]});
  if (Fits32(n_in))
    return RowReduce<kMax>(StridedRows<T, uint32_t>{px, kept, red}, store, n_out, len, x.device());
  RowReduce<kMax>(StridedRows<T, int64_t>{px, kept, red}, store, n_out, len, x.device());
}

// Reduces x over `axes`; a mean divides by `divisor` when one is given,
// else by the count of elements reduced into each output.
Tensor RunReduceOp(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim,
                   std::optional<double> divisor) {
  TESSEL_CHECK(IsFloating(x.dtype()))
      << cpu::ReduceOpName(op) << " supports f32, bf16 and f16 on CUDA; got " << x.dtype();
  SetDevice(x.device());
  std::set<int64_t> reduced;
  for (int64_t a : axes) reduced.insert(x.shape().NormalizeAxis(a));
  if (axes.empty())
    for (int64_t d = 0; d < x.ndim(); ++d) reduced.insert(d);
  std::vector<int64_t> out_dims;
  int64_t n_out = 1;
  for (int64_t d = 0; d < x.ndim(); ++d) {
    const bool r = reduced.count(d) > 0;
    if (!r) n_out *= x.shape().dims()[d];
    if (keepdim || !r) out_dims.push_back(r ? 1 : x.shape().dims()[d]);
  }
  const int64_t n_in = x.numel();
  TESSEL_CHECK(op != ReduceOp::kMax || n_in > 0 || n_out == 0)
      << "max over an empty dimension of " << x.shape() << " has no value";
  Tensor out = Tensor::Empty(Shape(out_dims), x.dtype(), x.device());
  if (n_out == 0) return out;
  const bool mean = op == ReduceOp::kMean;
  const double count = divisor.value_or(static_cast<double>(n_in) / static_cast<double>(n_out));
  VisitFloat(cpu::ReduceOpName(op), x.dtype(), [&]<typename T>(TypeTag<T>) {
    T* po = static_cast<T*>(out.raw_data());
    if (n_in == 0) {
      // Sums over nothing are 0; their mean is 0/0 (NaN), as on the CPU.
      const float value = mean ? static_cast<float>(0.0 / count) : 0.0f;
      return LaunchMap("reduce fill", n_out, FillFn<T>{value}, po);
    }
    const StoreFinal<T> store{po, mean, count};
    if (op == ReduceOp::kMax) return RunReduce<true>(x, reduced, store, n_out);
    RunReduce<false>(x, reduced, store, n_out);
  });
  return out;
}

}  // namespace

Tensor Reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& axes, bool keepdim) {
  return RunReduceOp(op, x, axes, keepdim, std::nullopt);
}

Tensor Mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdim, double divisor) {
  return RunReduceOp(ReduceOp::kMean, x, axes, keepdim, divisor);
}

Tensor BroadcastTo(const Tensor& x, const Shape& shape) {
  TESSEL_CHECK(x.ndim() <= shape.ndim() && cpu::BroadcastShapes(x.shape(), shape) == shape)
      << "expand: " << x.shape() << " does not broadcast to " << shape;
  SetDevice(x.device());
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  const int64_t n = shape.numel();
  if (n == 0) return out;
  VisitFloat("expand", x.dtype(), [&]<typename T>(TypeTag<T>) {
    const T* src = static_cast<const T*>(x.raw_data());
    T* dst = static_cast<T*>(out.raw_data());
    if (x.numel() == n) return CopyDevice(dst, src, n * sizeof(T));
    LaunchBroadcast("expand", shape, CopyFn{}, dst, {x.shape()}, src);
  });
  return out;
}

}  // namespace tessel::cuda
