#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/cpu/tensor_ops.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/tensor_ops.h"

namespace tessel::cuda {
namespace {

// Elements are copied as opaque units: the dtype's size, or wider (up to 16
// bytes, one vector load) where the runs, pitches and pointers allow.
template <int kBytes>
struct UnitOf;
template <>
struct UnitOf<1> {
  using type = uint8_t;
};
template <>
struct UnitOf<2> {
  using type = uint16_t;
};
template <>
struct UnitOf<4> {
  using type = uint32_t;
};
template <>
struct UnitOf<8> {
  using type = uint2;
};
template <>
struct UnitOf<16> {
  using type = uint4;
};

// Calls fn(std::integral_constant<int, bytes>) for a unit size.
template <typename Fn>
void VisitUnit(int64_t bytes, Fn&& fn) {
  switch (bytes) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 8:
      return fn(std::integral_constant<int, 8>{});
    case 16:
      return fn(std::integral_constant<int, 16>{});
    default:
      TESSEL_CHECK(false) << "no copy unit of " << bytes << " bytes";
  }
}

int64_t Address(const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); }

// The widest power-of-two unit of at most `widest` bytes dividing every value.
int64_t WidestUnit(std::initializer_list<int64_t> values, int64_t widest = 16) {
  int64_t unit = widest;
  for (int64_t v : values)
    while (v % unit != 0) unit /= 2;
  return unit;
}

// Index arithmetic dominates a copy's instructions, and 32-bit division is
// several times cheaper than 64-bit: kernels take the index type I, 32 bits
// whenever every offset fits.
constexpr int64_t kMax32 = INT32_MAX;

// Maps a flat row-major index over `dims` to an offset with `strides` (as
// StridedIndexer, in index type I).
template <typename I>
struct Indexer {
  int ndim = 0;
  I dims[StridedIndexer::kMaxDims] = {};
  I strides[StridedIndexer::kMaxDims] = {};

  explicit Indexer(const StridedIndexer& ix) : ndim(ix.ndim) {
    for (int d = 0; d < ndim; ++d) {
      dims[d] = static_cast<I>(ix.dims[d]);
      strides[d] = static_cast<I>(ix.strides[d]);
    }
  }
  // Unrolled over the most dims so that dims and strides are read at fixed
  // indices straight from the kernel's parameters (a loop to ndim copies
  // them to local memory first).
  __device__ I operator()(I flat) const {
    I offset = 0;
#pragma unroll
    for (int d = StridedIndexer::kMaxDims - 1; d > 0; --d) {
      if (d < ndim) {
        const I q = flat / dims[d];
        offset += (flat - q * dims[d]) * strides[d];
        flat = q;
      }
    }
    return offset + flat * strides[0];  // strides[0] is 0 for a 0-d indexer, whose flat is 0
  }
};

template <typename U, typename I>
__global__ void CopyRowsKernel(U* __restrict__ dst, I dst_pitch, const U* __restrict__ src, I src_pitch,
                               I width, I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I r = i / width, c = i - r * width;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
  }
}

// Copies `rows` runs of `width` bytes from src (runs `src_pitch` bytes apart)
// to dst (runs `dst_pitch` bytes apart): slices, concats and micro-batches
// are all such 2-D copies once the dims around the cut one are flattened.
void CopyRows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width, int64_t rows) {
  if (width == 0 || rows == 0) return;
  if (rows == 1 || (width == dst_pitch && width == src_pitch)) {
    Check(cudaMemcpyAsync(dst, src, static_cast<size_t>(width * rows), cudaMemcpyDeviceToDevice,
                          CurrentStream()),
          "cudaMemcpyAsync");
    return;
  }
  const int64_t unit = WidestUnit({width, dst_pitch, src_pitch, Address(dst), Address(src)});
  const int64_t w = width / unit, n = w * rows;
  const int64_t extent = (rows - 1) * (std::max(dst_pitch, src_pitch) / unit) + w;
  VisitUnit(unit, [&](auto bytes) {
    using U = typename UnitOf<decltype(bytes)::value>::type;
    auto launch = [&](auto index) {
      using I = decltype(index);
      CopyRowsKernel<U, I><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
          static_cast<U*>(dst), static_cast<I>(dst_pitch / unit), static_cast<const U*>(src),
          static_cast<I>(src_pitch / unit), static_cast<I>(w), static_cast<I>(n));
    };
    if (extent <= kMax32)
      launch(uint32_t{});
    else
      launch(int64_t{});
  });
  CheckLaunch("CopyRowsKernel");
}

template <typename U, typename I>
__global__ void GatherKernel(U* __restrict__ out, const U* __restrict__ in, Indexer<I> ix, I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    out[i] = in[ix(i)];
  }
}

// out[i] = in[ix(i)] over n units of `unit` bytes; `extent` bounds the
// offsets ix reaches.
void Gather(void* out, const void* in, const StridedIndexer& ix, int64_t n, int64_t extent, int64_t unit) {
  VisitUnit(unit, [&](auto bytes) {
    using U = typename UnitOf<decltype(bytes)::value>::type;
    if (n <= kMax32 && extent <= kMax32) {
      GatherKernel<U, uint32_t><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
          static_cast<U*>(out), static_cast<const U*>(in), Indexer<uint32_t>(ix), static_cast<uint32_t>(n));
    } else {
      GatherKernel<U, int64_t><<<Blocks(n), kThreads, 0, CurrentStream()>>>(
          static_cast<U*>(out), static_cast<const U*>(in), Indexer<int64_t>(ix), n);
    }
  });
  CheckLaunch("GatherKernel");
}

constexpr int kTile = 32, kTileRows = 8;

// A permute that moves the input's contiguous dim away from the last: the
// output is read as batch x [R, C] with out[ob + r * out_r_stride + c] =
// in[ib + r + c * in_c_stride]. A 32 x 32 tile goes through shared memory so
// that both the reads (along r) and the writes (along c) are coalesced.
template <typename U>
__global__ void TransposeKernel(U* __restrict__ out, const U* __restrict__ in, int64_t R, int64_t C,
                                int64_t in_c_stride, int64_t out_r_stride, int64_t tiles_r, int64_t tiles_c,
                                int64_t tiles, StridedIndexer in_batch, StridedIndexer out_batch) {
  __shared__ U tile[kTile][kTile + 1];  // [c][r]; the pad keeps column reads off one bank
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t tc = t % tiles_c, rest = t / tiles_c, tr = rest % tiles_r, b = rest / tiles_r;
    const int64_t r0 = tr * kTile, c0 = tc * kTile;
    const U* src = in + in_batch(b);
    U* dst = out + out_batch(b);
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t r = r0 + threadIdx.x, c = c0 + k;
      if (r < R && c < C) tile[k][threadIdx.x] = src[r + c * in_c_stride];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < R && c < C) dst[r * out_r_stride + c] = tile[threadIdx.x][k];
    }
    __syncthreads();
  }
}

// Flattened dims before and after `dim`.
void OuterInner(const Shape& shape, int64_t dim, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int64_t d = 0; d < dim; ++d) *outer *= shape.dims()[d];
  for (int64_t d = dim + 1; d < shape.ndim(); ++d) *inner *= shape.dims()[d];
}

}  // namespace

Tensor Permute(const Tensor& x, const std::vector<int64_t>& perm) {
  SetDevice(x.device());
  const Shape& in = x.shape();
  TESSEL_CHECK(static_cast<int64_t>(perm.size()) == in.ndim())
      << "permute of " << in << " needs " << in.ndim() << " axes, got " << perm.size();
  std::vector<int64_t> dims(perm.size()), src(perm.size());
  std::vector<bool> seen(perm.size(), false);
  const std::vector<int64_t> in_strides = in.ContiguousStrides();
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = in.NormalizeAxis(perm[i]);
    TESSEL_CHECK(!seen[p]) << "permute lists axis " << p << " twice";
    seen[p] = true;
    dims[i] = in.dims()[p];
    src[i] = in_strides[p];
  }
  Tensor out = Tensor::Empty(Shape(dims), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const int64_t es = static_cast<int64_t>(ElementSize(x.dtype()));

  // Drop size-1 dims and merge output neighbours that are neighbours in the
  // input too: most permutes collapse to two or three dims, and one that
  // keeps the order collapses to a plain copy.
  std::vector<int64_t> cd, cs;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 1) continue;
    if (!cd.empty() && cs.back() == src[i] * dims[i]) {
      cd.back() *= dims[i];
      cs.back() = src[i];
    } else {
      cd.push_back(dims[i]);
      cs.push_back(src[i]);
    }
  }
  const int nd = static_cast<int>(cd.size());
  if (nd <= 1) {
    Check(cudaMemcpyAsync(out.raw_data(), x.raw_data(), out.nbytes(), cudaMemcpyDeviceToDevice,
                          CurrentStream()),
          "cudaMemcpyAsync");
    return out;
  }
  TESSEL_CHECK(nd <= StridedIndexer::kMaxDims)
      << "CUDA permute takes at most " << StridedIndexer::kMaxDims << " non-adjacent dimensions, got " << in
      << " permuted to " << Shape(dims);

  // The output dim that is the input's contiguous one.
  int j = nd - 1;
  while (j >= 0 && cs[j] != 1) --j;
  const bool tiled = j >= 0 && j != nd - 1 && cd[j] >= kTile / 2 && cd[nd - 1] >= kTile / 2;
  if (!tiled) {
    // Runs along the last dim are contiguous in the input (j == nd - 1): read
    // them in units as wide as their length and the pointers allow.
    int64_t unit = es;
    if (j == nd - 1) {
      unit = WidestUnit({cd[nd - 1] * es, Address(x.raw_data()), Address(out.raw_data())});
      for (int d = 0; d < nd - 1; ++d) unit = WidestUnit({cs[d] * es}, unit);
    }
    const int64_t per = unit / es;
    StridedIndexer ix;
    ix.ndim = nd;
    for (int d = 0; d < nd; ++d) {
      ix.dims[d] = d == nd - 1 ? cd[d] / per : cd[d];
      ix.strides[d] = d == nd - 1 && j == nd - 1 ? 1 : cs[d] / per;
    }
    const int64_t n = out.numel() / per;
    Gather(out.raw_data(), x.raw_data(), ix, n, n, unit);
    return out;
  }

  std::vector<int64_t> out_strides(nd, 1);
  for (int d = nd - 2; d >= 0; --d) out_strides[d] = out_strides[d + 1] * cd[d + 1];
  StridedIndexer in_batch, out_batch;
  int64_t batch = 1;
  for (int d = 0; d < nd - 1; ++d) {
    if (d == j) continue;
    in_batch.dims[in_batch.ndim] = out_batch.dims[out_batch.ndim] = cd[d];
    in_batch.strides[in_batch.ndim++] = cs[d];
    out_batch.strides[out_batch.ndim++] = out_strides[d];
    batch *= cd[d];
  }
  const int64_t R = cd[j], C = cd[nd - 1];
  const int64_t tiles_r = (R + kTile - 1) / kTile, tiles_c = (C + kTile - 1) / kTile;
  const int64_t tiles = batch * tiles_r * tiles_c;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 65535LL * 8));
  VisitUnit(es, [&](auto bytes) {
    using U = typename UnitOf<decltype(bytes)::value>::type;
    TransposeKernel<U><<<grid, dim3(kTile, kTileRows), 0, CurrentStream()>>>(
        static_cast<U*>(out.raw_data()), static_cast<const U*>(x.raw_data()), R, C, cs[nd - 1],
        out_strides[j], tiles_r, tiles_c, tiles, in_batch, out_batch);
  });
  CheckLaunch("TransposeKernel");
  return out;
}

Tensor Slice(const Tensor& x, int64_t dim, int64_t begin, int64_t end) {
  SetDevice(x.device());
  dim = x.shape().NormalizeAxis(dim);
  const int64_t size = x.shape().dims()[dim];
  TESSEL_CHECK(0 <= begin && begin <= end && end <= size)
      << "slice [" << begin << ":" << end << "] of dimension " << dim << " (size " << size << ") of "
      << x.shape();
  std::vector<int64_t> dims = x.shape().dims();
  dims[dim] = end - begin;
  Tensor out = Tensor::Empty(Shape(dims), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  int64_t outer, inner;
  OuterInner(x.shape(), dim, &outer, &inner);
  const int64_t es = static_cast<int64_t>(ElementSize(x.dtype()));
  const int64_t width = (end - begin) * inner * es;
  CopyRows(out.raw_data(), width, static_cast<const char*>(x.raw_data()) + begin * inner * es,
           size * inner * es, width, outer);
  return out;
}

Tensor PadSlice(const Tensor& part, const Shape& shape, int64_t dim, int64_t begin) {
  SetDevice(part.device());
  dim = shape.NormalizeAxis(dim);
  TESSEL_CHECK(part.ndim() == shape.ndim()) << "CopyBox needs shapes, offsets and box of one rank";
  for (int64_t d = 0; d < shape.ndim(); ++d) {
    const int64_t offset = d == dim ? begin : 0, extent = part.shape().dims()[d];
    if (extent == 0) break;
    TESSEL_CHECK(offset >= 0 && offset + extent <= shape.dims()[d])
        << "CopyBox: box extent " << extent << " at dimension " << d << " does not fit (source offset 0 of "
        << extent << ", destination offset " << offset << " of " << shape.dims()[d] << ")";
  }
  Tensor out = Tensor::Empty(shape, part.dtype(), part.device());
  if (out.numel() == 0) return out;
  if (part.numel() < out.numel()) Zero(out);
  if (part.numel() == 0) return out;
  int64_t outer, inner;
  OuterInner(shape, dim, &outer, &inner);
  const int64_t es = static_cast<int64_t>(ElementSize(part.dtype()));
  const int64_t width = part.shape().dims()[dim] * inner * es;
  CopyRows(static_cast<char*>(out.raw_data()) + begin * inner * es, shape.dims()[dim] * inner * es,
           part.raw_data(), width, width, outer);
  return out;
}

Tensor Concat(const std::vector<Tensor>& xs, int64_t dim) {
  TESSEL_CHECK(!xs.empty()) << "concat of no tensors";
  SetDevice(xs[0].device());
  CheckOnDevice("concat", xs[0].device(), xs);
  const Shape shape = cpu::ConcatShape(xs, dim);
  dim = xs[0].shape().NormalizeAxis(dim);
  Tensor out = Tensor::Empty(shape, xs[0].dtype(), xs[0].device());
  if (out.numel() == 0) return out;
  int64_t outer, inner;
  OuterInner(shape, dim, &outer, &inner);
  const int64_t es = static_cast<int64_t>(ElementSize(out.dtype()));
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t width = x.shape().dims()[dim] * inner * es;
    CopyRows(static_cast<char*>(out.raw_data()) + offset * inner * es, shape.dims()[dim] * inner * es,
             x.raw_data(), width, width, outer);
    offset += x.shape().dims()[dim];
  }
  return out;
}

Tensor MicroBatch(const Tensor& x, int64_t block_rows, int64_t index, int64_t count) {
  SetDevice(x.device());
  if (x.ndim() >= 1 && x.shape()[0] == 0) return Tensor::Empty(x.shape(), x.dtype(), x.device());
  TESSEL_CHECK(x.ndim() >= 1 && count >= 1 && 0 <= index && index < count && block_rows >= 1 &&
               block_rows % count == 0 && x.shape()[0] % block_rows == 0)
      << "micro_batch: micro-batch " << index << " of " << count << " of " << x.ToString()
      << " read as blocks of " << block_rows
      << " rows; the rows must be whole blocks and a block a multiple of " << count << " rows";
  const int64_t chunk = block_rows / count, blocks = x.shape()[0] / block_rows;
  std::vector<int64_t> dims = x.shape().dims();
  dims[0] = blocks * chunk;
  Tensor out = Tensor::Empty(Shape(dims), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  const int64_t row = out.numel() / dims[0] * static_cast<int64_t>(ElementSize(x.dtype()));
  CopyRows(out.raw_data(), chunk * row, static_cast<const char*>(x.raw_data()) + index * chunk * row,
           block_rows * row, chunk * row, blocks);
  return out;
}

}  // namespace tessel::cuda
