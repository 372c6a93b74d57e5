#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <optional>
#include <type_traits>

#include "ops/cpu/qkv_heads.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/qkv_heads.h"
#include "ops/cuda/row_util.cuh"
#include "ops/cuda/tensor_ops.h"

namespace tessel::cuda {
namespace {

// Where the rows of (batch x head) n of a tensor start, and the elements
// from one row to the next. Attention's own [n, s, d] tensors: n s d and d.
// The fused projection [b, s, heads, 3 d] that qkv_attention reads q, k
// and v from (and writes their gradients to), and its [b, s, heads, d]
// output: the heads side by side within each row.
struct RowLayout {
  int64_t heads = 1;         // n = batch * heads + head
  int64_t batch_stride = 0;  // elements
  int64_t head_stride = 0;
  int64_t ld = 0;  // between rows
  __host__ __device__ __forceinline__ int64_t Base(int64_t n) const {
    return (n / heads) * batch_stride + (n % heads) * head_stride;
  }
  static RowLayout Plain(int64_t rows, int64_t d) { return {1, rows * d, 0, d}; }
  // s rows of `row` elements each, a head's features `head_stride` after
  // the previous head's.
  static RowLayout Packed(int64_t heads, int64_t s, int64_t head_stride, int64_t row) {
    return {heads, s * row, head_stride, row};
  }
};

struct Dims {
  int64_t n, sq, sk;
  int d;
  float scale;
  bool causal;
  int64_t shift;  // key j visible to local query i when j <= i + shift (causal)
  // The tensor-core kernels' layouts of q (and dq), k (dk), v (dv), and
  // out (dout); the warp-per-row kernels take Plain ones only.
  RowLayout lq, lk, lv, lo;
};

__device__ __forceinline__ bool Visible(const Dims& s, int64_t i, int64_t j) {
  return j < s.sk && (!s.causal || j <= i + s.shift);
}

// Keys [0, KeyEnd) can be visible to local queries [0, last].
__host__ __device__ __forceinline__ int64_t KeyEnd(const Dims& s, int64_t last) {
  if (!s.causal) return s.sk;
  const int64_t end = last + s.shift + 1;
  return end < 0 ? 0 : (end < s.sk ? end : s.sk);
}

// ------------------------------------------------ a warp per query row (any d <= 256)

constexpr int kRowWarps = 4;
constexpr int kMaxPerLane = 8;  // d <= 32 * 8

template <typename T>
__global__ void RowForwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 T* __restrict__ out, float* __restrict__ lse, Dims s) {
  const int lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kRowWarps + threadIdx.x / 32, b = blockIdx.x;
  if (i >= s.sq) return;
  const int64_t row = b * s.sq + i;
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int c = lane + 32 * e;
    qv[e] = c < s.d ? ToF32(q[row * s.d + c]) : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t end = KeyEnd(s, i);
  for (int64_t j = 0; j < end; ++j) {
    const T* kr = k + (b * s.sk + j) * s.d;
    float part = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < s.d) part += qv[e] * ToF32(kr[c]);
    }
    const float score = WarpAllReduce(part, SumOp{}) * s.scale;
    const float m_new = fmaxf(m, score);
    const float alpha = expf(m - m_new), p = expf(score - m_new);
    l = l * alpha + p;
    const T* vr = v + (b * s.sk + j) * s.d;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < s.d) acc[e] = acc[e] * alpha + p * ToF32(vr[c]);
    }
    m = m_new;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int c = lane + 32 * e;
    if (c < s.d) out[row * s.d + c] = FromF32<T>(acc[e] * inv);
  }
  if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : INFINITY;
}

// dq per row; dk and dv summed over the rows into f32 buffers (atomics).
template <typename T>
__global__ void RowBackwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                  const T* __restrict__ out, const float* __restrict__ lse,
                                  const T* __restrict__ dout, T* __restrict__ dq, float* __restrict__ dk,
                                  float* __restrict__ dv, Dims s) {
  const int lane = threadIdx.x % 32;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kRowWarps + threadIdx.x / 32, b = blockIdx.x;
  if (i >= s.sq) return;
  const int64_t row = b * s.sq + i;
  float qv[kMaxPerLane], gv[kMaxPerLane], dqv[kMaxPerLane];
  float delta = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int c = lane + 32 * e;
    qv[e] = c < s.d ? ToF32(q[row * s.d + c]) : 0.0f;
    gv[e] = c < s.d ? ToF32(dout[row * s.d + c]) : 0.0f;
    delta += c < s.d ? gv[e] * ToF32(out[row * s.d + c]) : 0.0f;
    dqv[e] = 0.0f;
  }
  delta = WarpAllReduce(delta, SumOp{});
  const float row_lse = lse[row];
  const int64_t end = KeyEnd(s, i);
  for (int64_t j = 0; j < end; ++j) {
    const T *kr = k + (b * s.sk + j) * s.d, *vr = v + (b * s.sk + j) * s.d;
    float qk = 0.0f, gvdot = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < s.d) {
        qk += qv[e] * ToF32(kr[c]);
        gvdot += gv[e] * ToF32(vr[c]);
      }
    }
    qk = WarpAllReduce(qk, SumOp{});
    gvdot = WarpAllReduce(gvdot, SumOp{});
    const float p = expf(qk * s.scale - row_lse);
    const float ds = p * (gvdot - delta) * s.scale;
    float *dkr = dk + (b * s.sk + j) * s.d, *dvr = dv + (b * s.sk + j) * s.d;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int c = lane + 32 * e;
      if (c < s.d) {
        dqv[e] += ds * ToF32(kr[c]);
        atomicAdd(dkr + c, ds * qv[e]);
        atomicAdd(dvr + c, p * gv[e]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int c = lane + 32 * e;
    if (c < s.d) dq[row * s.d + c] = FromF32<T>(dqv[e]);
  }
}

// ------------------------------------------------ flash tiles on the tensor cores (bf16, f16)
//
// FlashAttention-2's structure with everything a warp owns in registers:
// each warp owns MT m-tiles of 16 rows, its scores, probabilities and
// output live in mma.sync fragments (m16n8k16, f32 sums), and only the
// tiles that all four warps read (k and v, or q and dout) go through shared
// memory, loaded with cp.async one tile ahead of the products that read it.
// A warp with two m-tiles loads each fragment of the shared tile once for
// both, which halves the shared-memory reads per product.

constexpr int kBr = 64, kBc = 64;   // rows of the tiles the backward kernels own, and of k and v tiles
constexpr int kFlashThreads = 128;  // four warps
// The forward's m-tiles per warp: two at head size 64; at 128 the output
// accumulator would not fit the registers twice.
template <int D>
constexpr int kForwardMTiles = D <= 64 ? 2 : 1;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Shared-memory rows are padded by 16 bytes, so the eight 16-byte rows an
// ldmatrix reads start in different banks.
template <int D>
constexpr int kLdTile = D + 8;

template <typename T, int D, int kRows = kBr>
constexpr size_t TileBytes() {
  return static_cast<size_t>(kRows) * kLdTile<D> * sizeof(T);
}

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without a register round trip; zeros when !valid
// (rows past the end, so no stale NaN meets a zero probability).
__device__ __forceinline__ void CopyAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CopyAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CopyAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Rows [row0, row0 + kRows) of a [rows, D] matrix (rows `ld` elements
// apart) into a padded tile, zeros past `rows`.
template <typename T, int D, int kRows = kBr>
__device__ __forceinline__ void LoadTileAsync(T* dst, const T* src, int64_t row0, int64_t rows, int64_t ld) {
  constexpr int kVecPerRow = D * sizeof(T) / 16, kPerVec = 16 / sizeof(T);
  for (int x = threadIdx.x; x < kRows * kVecPerRow; x += kFlashThreads) {
    const int r = x / kVecPerRow, c = x % kVecPerRow;
    const bool valid = row0 + r < rows;
    CopyAsync16(dst + r * kLdTile<D> + c * kPerVec, valid ? src + (row0 + r) * ld + c * kPerVec : src, valid);
  }
}

// Starts copying key tile `tile` of k and v ([sk, D] each, as laid out in
// s) into buffer `buf` of ks and vs.
template <typename T, int D>
__device__ __forceinline__ void LoadKeyTileAsync(T* ks, T* vs, int buf, const T* k, const T* v, int64_t tile,
                                                 const Dims& s) {
  LoadTileAsync<T, D>(ks + buf * kBc * kLdTile<D>, k, tile * kBc, s.sk, s.lk.ld);
  LoadTileAsync<T, D>(vs + buf * kBc * kLdTile<D>, v, tile * kBc, s.sk, s.lv.ld);
}

// One step of the double-buffered loop: commits the copies issued for the
// next tile, waits for everything before them (this step's tile, and with
// the first step the block's own rows) and makes it visible to all threads.
__device__ __forceinline__ void WaitForThisTile() {
  CopyAsyncCommit();
  CopyAsyncWait<1>();
  __syncthreads();
}

// Four 8x8 matrices of 16-bit elements from shared memory; lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void LoadMatrices(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p))
               : "memory");
}
__device__ __forceinline__ void LoadMatricesTransposed(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddress(p))
               : "memory");
}

// c[16 x 8] += a[16 x 16] b[16 x 8] on the tensor cores, f32 sums. Fragment
// layouts (g = lane / 4, t = lane % 4): a holds rows g and g + 8, columns
// 2t, 2t + 1 (a[0], a[1]) and 2t + 8, 2t + 9 (a[2], a[3]); b holds column g,
// rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1); c[e] is row g + 8 (e / 2),
// column 2t + e % 2.
template <typename T>
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, the first in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The a fragments of MT m-tiles, rows [row0 + 16 mt, + 16) of a padded
// tile, all D columns.
template <typename T, int D, int MT>
__device__ __forceinline__ void LoadRowFragments(uint32_t (&a)[MT][D / 16][4], const T* tile, int row0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      LoadMatrices(a[mt][kk],
                   tile + (row0 + 16 * mt + lane % 8 + (m % 2) * 8) * kLdTile<D> + 16 * kk + (m / 2) * 8);
}

// acc[mt][16 x 64] += a[mt][16 x D] x^T, x the 64 rows of a padded tile
// (row n of x is column n of the product): the scores of MT m-tiles of rows
// against a tile, each fragment of x loaded once for all of them.
template <typename T, int D, int MT>
__device__ __forceinline__ void TimesTileT(float (&acc)[MT][8][4], const uint32_t (&a)[MT][D / 16][4],
                                           const T* x) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t b[4];
      LoadMatrices(b, x + (16 * np + lane % 8 + (m / 2) * 8) * kLdTile<D> + 16 * kk + (m % 2) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<T>(acc[mt][2 * np], a[mt][kk], b[0], b[1]);
        Mma<T>(acc[mt][2 * np + 1], a[mt][kk], b[2], b[3]);
      }
    }
  }
}

// acc[mt][16 x D] += p[mt][16 x 64] x, x a padded 64 x D tile and p[mt] the
// a fragments of four 16-column steps.
template <typename T, int D, int MT>
__device__ __forceinline__ void TimesTile(float (&acc)[MT][D / 8][4], const uint32_t (&p)[MT][4][4],
                                          const T* x) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      LoadMatricesTransposed(b, x + (16 * kk + lane % 8 + (m % 2) * 8) * kLdTile<D> + 16 * dp + (m / 2) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma<T>(acc[mt][2 * dp], p[mt][kk], b[0], b[1]);
        Mma<T>(acc[mt][2 * dp + 1], p[mt][kk], b[2], b[3]);
      }
    }
  }
}

// A [16 x 64] f32 accumulator as the a fragments of a following product
// (the accumulator's layout is the a operand's, two columns per register).
template <typename T>
__device__ __forceinline__ void ToFragments(uint32_t (&p)[4][4], const float (&acc)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    p[kk][0] = Pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
    p[kk][1] = Pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
    p[kk][2] = Pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    p[kk][3] = Pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

template <int M, int N>
__device__ __forceinline__ void Fill(float (&acc)[M][N][4], float value) {
#pragma unroll
  for (int mt = 0; mt < M; ++mt)
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][i][e] = value;
}

// Writes rows [row0, row0 + 16) of a [rows, D] matrix (rows `ld` elements
// apart) from an accumulator times `scale`, rows past `rows` dropped.
template <typename T, int D>
__device__ __forceinline__ void StoreRows(T* dst, const float (&acc)[D / 8][4], int64_t row0, int64_t rows,
                                          int64_t ld, const float (&scale)[2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + g + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
      *reinterpret_cast<uint32_t*>(dst + row * ld + 8 * nb + 2 * t) =
          Pack2<T>(acc[nb][2 * h] * scale[h], acc[nb][2 * h + 1] * scale[h]);
  }
}

// Whether any (query, key) pair of query rows [i0, i0 + 16) and keys
// [j0, j0 + jn) is hidden, so that a tile needs its mask applied.
__device__ __forceinline__ bool NeedsMask(const Dims& s, int64_t i0, int64_t in, int64_t j0, int64_t jn) {
  return j0 + jn > s.sk || i0 + in > s.sq || (s.causal && j0 + jn - 1 > i0 + s.shift);
}

template <int MT>
constexpr int kForwardRows = 4 * 16 * MT;  // query rows per block

template <typename T, int D, int MT>
constexpr size_t FlashForwardSmem() {
  // q, and k and v twice (the next tile loads during this one)
  return TileBytes<T, D, kForwardRows<MT>>() + 4 * TileBytes<T, D>();
}

// One block: kForwardRows query rows of one (batch, head), 16 MT per warp;
// loops over key tiles with the running maximum and sum per row
// (FlashAttention's forward). Scores are kept in base 2 (scale log2(e)
// folded in) for ex2.
template <typename T, int D, int MT>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ out, float* __restrict__ lse, Dims s) {
  constexpr int kRows = kForwardRows<MT>, kTile = kBc * kLdTile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + kRows * kLdTile<D>;  // two buffers
  T* vs = ks + 2 * kTile;           // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.x;
  // Under causal the last query rows see the most keys: start those first.
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kRows, r0 = q0 + 16 * MT * warp;
  const T *kb = k + s.lk.Base(b), *vb = v + s.lv.Base(b);
  const int64_t tiles = (KeyEnd(s, q0 + kRows - 1) + kBc - 1) / kBc;
  LoadTileAsync<T, D, kRows>(qs, q + s.lq.Base(b), q0, s.sq, s.lq.ld);
  if (tiles > 0) {
    LoadKeyTileAsync<T, D>(ks, vs, 0, kb, vb, 0, s);
  }
  CopyAsyncCommit();
  const float c = s.scale * kLog2e;
  float o[MT][D / 8][4], m[MT][2], l[MT][2];
  Fill(o, 0.0f);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  uint32_t qf[MT][D / 16][4];
  for (int64_t j = 0; j < tiles; ++j) {
    const int buf = j % 2;
    // Into the buffer read in the last step, which all warps have left.
    if (j + 1 < tiles) LoadKeyTileAsync<T, D>(ks, vs, 1 - buf, kb, vb, j + 1, s);
    WaitForThisTile();
    if (j == 0) LoadRowFragments<T, D, MT>(qf, qs, 16 * MT * warp);
    float sc[MT][8][4];
    Fill(sc, 0.0f);
    TimesTileT<T, D, MT>(sc, qf, ks + buf * kTile);
    const int64_t k0 = j * kBc;
    uint32_t pf[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int64_t rm = r0 + 16 * mt;
      const bool masked = NeedsMask(s, rm, 16, k0, kBc);
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[mt][nb][e] * c;
          if (masked && !Visible(s, rm + g + 8 * (e / 2), k0 + 8 * nb + 2 * t + e % 2)) x = -INFINITY;
          sc[mt][nb][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the four lanes of a row hold its 64 columns
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
        const float m_new = fmaxf(m[mt][h], mx[h]);
        // A row with nothing visible yet keeps zeros (and no NaN from -inf - -inf).
        alpha[h] = m_new == -INFINITY ? 1.0f : FastExp2(m[mt][h] - m_new);
        m[mt][h] = m_new;
        l[mt][h] *= alpha[h];
      }
#pragma unroll
      for (int nb = 0; nb < 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const float p = m[mt][h] == -INFINITY ? 0.0f : FastExp2(sc[mt][nb][e] - m[mt][h]);
          sc[mt][nb][e] = p;
          l[mt][h] += p;  // this lane's columns; the row's four lanes are summed at the end
        }
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][nb][e] *= alpha[e / 2];
      ToFragments<T>(pf[mt], sc[mt]);
    }
    TimesTile<T, D, MT>(o, pf, vs + buf * kTile);
    __syncthreads();  // all warps are done with this buffer before it is loaded again
  }
  CopyAsyncWait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[mt][h] += __shfl_xor_sync(0xffffffff, l[mt][h], 1);
      l[mt][h] += __shfl_xor_sync(0xffffffff, l[mt][h], 2);
      inv[h] = l[mt][h] > 0.0f ? 1.0f / l[mt][h] : 0.0f;
      const int64_t i = r0 + 16 * mt + g + 8 * h;
      if (t == 0 && i < s.sq)
        lse[b * s.sq + i] = l[mt][h] > 0.0f ? (m[mt][h] + log2f(l[mt][h])) * kLn2 : INFINITY;
    }
    StoreRows<T, D>(out + s.lo.Base(b), o[mt], r0 + 16 * mt, s.sq, s.lo.ld, inv);
  }
}

// delta[n sq + i] = sum_c dout[n][i][c] * out[n][i][c] (the backward's row
// term), out and dout laid out as s.lo.
template <typename T>
__global__ void RowDotKernel(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ dot,
                             Dims s) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= s.n * s.sq) return;
  const int64_t at = s.lo.Base(row / s.sq) + (row % s.sq) * s.lo.ld;
  float acc = 0.0f;
  for (int c = lane; c < s.d; c += 32) acc += ToF32(a[at + c]) * ToF32(b[at + c]);
  acc = WarpAllReduce(acc, SumOp{});
  if (lane == 0) dot[row] = acc;
}

template <typename T, int D>
constexpr size_t FlashBackwardKvSmem() {
  // k and v; q and dout twice; lse (base 2) and delta of both q tiles.
  return 6 * TileBytes<T, D>() + 4 * kBr * sizeof(float);
}

// dk and dv. One block: 64 keys of one (batch, head), each warp owning 16 of
// them; loops over the query tiles that can see them with the transposed
// scores s^T = k q^T and dp^T = v dout^T in registers, so that p^T and
// ds^T = p^T (dp^T - delta) are the a operands of dv += p^T dout and
// dk += ds^T q (FlashAttention-2's backward, without its dq: see
// FlashBackwardQKernel).
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          const T* __restrict__ dout, T* __restrict__ dk, T* __restrict__ dv, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTile = kBr * kLdTile<D>;
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kTile;
  T* qs = vs + kTile;                                       // two buffers
  T* gs = qs + 2 * kTile;                                   // dout, two buffers
  float* lse_s = reinterpret_cast<float*>(gs + 2 * kTile);  // two buffers
  float* delta_s = lse_s + 2 * kBr;                         // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.x, k0 = static_cast<int64_t>(blockIdx.y) * kBc, j0 = k0 + 16 * warp;
  const T *qb = q + s.lq.Base(b), *gb = dout + s.lo.Base(b);
  // The first query that sees key k0: i + shift >= k0.
  int64_t q_begin = 0;
  if (s.causal && k0 - s.shift > 0) q_begin = (k0 - s.shift) / kBr * kBr;
  const int64_t tiles = q_begin < s.sq ? (s.sq - q_begin + kBr - 1) / kBr : 0;
  auto load_rows = [&](int buf, int64_t q0) {
    LoadTileAsync<T, D>(qs + buf * kTile, qb, q0, s.sq, s.lq.ld);
    LoadTileAsync<T, D>(gs + buf * kTile, gb, q0, s.sq, s.lo.ld);
    if (threadIdx.x < kBr) {  // read after the __syncthreads of the step that uses them
      const int64_t i = q0 + threadIdx.x;
      lse_s[buf * kBr + threadIdx.x] = i < s.sq ? lse[b * s.sq + i] * kLog2e : INFINITY;
      delta_s[buf * kBr + threadIdx.x] = i < s.sq ? delta[b * s.sq + i] : 0.0f;
    }
  };
  LoadTileAsync<T, D>(ks, k + s.lk.Base(b), k0, s.sk, s.lk.ld);
  LoadTileAsync<T, D>(vs, v + s.lv.Base(b), k0, s.sk, s.lv.ld);
  if (tiles > 0) load_rows(0, q_begin);
  CopyAsyncCommit();
  const float c = s.scale * kLog2e;
  float dka[1][D / 8][4], dva[1][D / 8][4];
  Fill(dka, 0.0f);
  Fill(dva, 0.0f);
  uint32_t kf[1][D / 16][4], vf[1][D / 16][4];
  for (int64_t j = 0; j < tiles; ++j) {
    const int buf = j % 2;
    const int64_t q0 = q_begin + j * kBr;
    if (j + 1 < tiles) load_rows(1 - buf, q0 + kBr);
    WaitForThisTile();
    if (j == 0 || D > 64) {  // at D 128 holding them would spill the accumulators
      LoadRowFragments<T, D, 1>(kf, ks, 16 * warp);
      LoadRowFragments<T, D, 1>(vf, vs, 16 * warp);
    }
    const T *qt = qs + buf * kTile, *gt = gs + buf * kTile;
    const float *lse_t = lse_s + buf * kBr, *delta_t = delta_s + buf * kBr;
    float st[1][8][4], dpt[1][8][4];  // [key][query]
    Fill(st, 0.0f);
    Fill(dpt, 0.0f);
    TimesTileT<T, D, 1>(st, kf, qt);
    TimesTileT<T, D, 1>(dpt, vf, gt);
    const bool masked = NeedsMask(s, q0, kBr, j0, 16);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * nb + 2 * t + e % 2;  // the query
        const bool seen = !masked || (q0 + col < s.sq && Visible(s, q0 + col, j0 + g + 8 * (e / 2)));
        const float p = seen ? FastExp2(st[0][nb][e] * c - lse_t[col]) : 0.0f;
        st[0][nb][e] = p;
        dpt[0][nb][e] = p * (dpt[0][nb][e] - delta_t[col]);
      }
    uint32_t pf[1][4][4], dsf[1][4][4];
    ToFragments<T>(pf[0], st[0]);
    ToFragments<T>(dsf[0], dpt[0]);
    TimesTile<T, D, 1>(dva, pf, gt);
    TimesTile<T, D, 1>(dka, dsf, qt);
    __syncthreads();  // all warps are done with this buffer before it is loaded again
  }
  CopyAsyncWait<0>();
  const float one[2] = {1.0f, 1.0f}, scale[2] = {s.scale, s.scale};
  StoreRows<T, D>(dk + s.lk.Base(b), dka[0], j0, s.sk, s.lk.ld, scale);
  StoreRows<T, D>(dv + s.lv.Base(b), dva[0], j0, s.sk, s.lv.ld, one);
}

template <typename T, int D>
constexpr size_t FlashBackwardQSmem() {
  return 6 * TileBytes<T, D>();  // q and dout; k and v twice
}

// dq. One block: 64 query rows of one (batch, head); loops over the key
// tiles they see, recomputing p and ds as the dk/dv kernel does (two more
// products per tile, instead of summing dq across blocks with atomics, so
// the result is deterministic).
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         const T* __restrict__ dout, T* __restrict__ dq, Dims s) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kTile = kBr * kLdTile<D>;
  T* qs = reinterpret_cast<T*>(smem);
  T* gs = qs + kTile;      // dout
  T* ks = gs + kTile;      // two buffers
  T* vs = ks + 2 * kTile;  // two buffers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.x;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kBr, r0 = q0 + 16 * warp;
  const T *kb = k + s.lk.Base(b), *vb = v + s.lv.Base(b);
  const int64_t tiles = (KeyEnd(s, q0 + kBr - 1) + kBc - 1) / kBc;
  LoadTileAsync<T, D>(qs, q + s.lq.Base(b), q0, s.sq, s.lq.ld);
  LoadTileAsync<T, D>(gs, dout + s.lo.Base(b), q0, s.sq, s.lo.ld);
  if (tiles > 0) {
    LoadKeyTileAsync<T, D>(ks, vs, 0, kb, vb, 0, s);
  }
  CopyAsyncCommit();
  float lse2[2], dl[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // past sq: +inf and 0, so the probabilities are 0
    const int64_t i = r0 + g + 8 * h;
    lse2[h] = i < s.sq ? lse[b * s.sq + i] * kLog2e : INFINITY;
    dl[h] = i < s.sq ? delta[b * s.sq + i] : 0.0f;
  }
  const float c = s.scale * kLog2e;
  float dqa[1][D / 8][4];
  Fill(dqa, 0.0f);
  uint32_t qf[1][D / 16][4], gf[1][D / 16][4];
  for (int64_t j = 0; j < tiles; ++j) {
    const int buf = j % 2;
    if (j + 1 < tiles) LoadKeyTileAsync<T, D>(ks, vs, 1 - buf, kb, vb, j + 1, s);
    WaitForThisTile();
    if (j == 0 || D > 64) {  // at D 128 holding them would spill the accumulators
      LoadRowFragments<T, D, 1>(qf, qs, 16 * warp);
      LoadRowFragments<T, D, 1>(gf, gs, 16 * warp);
    }
    const T *kt = ks + buf * kTile, *vt = vs + buf * kTile;
    float sc[1][8][4], dp[1][8][4];
    Fill(sc, 0.0f);
    Fill(dp, 0.0f);
    TimesTileT<T, D, 1>(sc, qf, kt);
    TimesTileT<T, D, 1>(dp, gf, vt);
    const int64_t k0 = j * kBc;
    const bool masked = NeedsMask(s, r0, 16, k0, kBc);
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const bool seen = !masked || Visible(s, r0 + g + 8 * h, k0 + 8 * nb + 2 * t + e % 2);
        const float p = seen ? FastExp2(sc[0][nb][e] * c - lse2[h]) : 0.0f;
        dp[0][nb][e] = p * (dp[0][nb][e] - dl[h]);
      }
    uint32_t dsf[1][4][4];
    ToFragments<T>(dsf[0], dp[0]);
    TimesTile<T, D, 1>(dqa, dsf, kt);
    __syncthreads();  // all warps are done with this buffer before it is loaded again
  }
  CopyAsyncWait<0>();
  const float scale[2] = {s.scale, s.scale};
  StoreRows<T, D>(dq + s.lq.Base(b), dqa[0], r0, s.sq, s.lq.ld, scale);
}

template <typename T>
__global__ void CastF32Kernel(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  TESSEL_CUDA_GRID_LOOP(i, n) dst[i] = FromF32<T>(src[i]);
}

// ------------------------------------------------ host side

Dims CheckedDims(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionOptions& o) {
  for (const Tensor* t : {&q, &k, &v}) {
    TESSEL_CHECK(t->ndim() >= 3 && t->dtype() == q.dtype())
        << op << " needs q, k and v of rank >= 3 and one dtype; got " << t->ToString() << " beside "
        << q.ToString();
  }
  const int64_t d = q.shape()[-1], sq = q.shape()[-2], sk = k.shape()[-2];
  const int64_t n = sq * d == 0 ? 0 : q.numel() / (sq * d);
  TESSEL_CHECK(k.shape() == v.shape() && k.shape()[-1] == d && k.numel() == n * sk * d)
      << op << ": q " << q.shape() << ", k " << k.shape() << ", v " << v.shape()
      << "; expected [..., sq, d], [..., sk, d], [..., sk, d] with the same leading dims";
  TESSEL_CHECK(d <= 32 * kMaxPerLane)
      << op << ": head size " << d << " is over the CUDA kernel's " << 32 * kMaxPerLane;
  // Query tiles (or rows in fours) and key tiles go on the grid's y axis.
  TESSEL_CHECK(sq <= 4 * 65535LL && sk <= 64 * 65535LL)
      << op << ": " << sq << " queries and " << sk << " keys; the CUDA kernels take up to " << 4 * 65535LL
      << " queries and " << 64 * 65535LL << " keys";
  CheckOnDevice(op, q.device(), {k, v});
  SetDevice(q.device());
  return {n,
          sq,
          sk,
          static_cast<int>(d),
          o.scale,
          o.causal,
          o.causal_shift,
          RowLayout::Plain(sq, d),
          RowLayout::Plain(sk, d),
          RowLayout::Plain(sk, d),
          RowLayout::Plain(sq, d)};
}

bool Aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % 16 == 0; }

// The tensor-core tiles take bf16 and f16 with a head size of 64 or 128.
bool UsesFlashTiles(const Dims& s, std::initializer_list<const Tensor*> ts) {
  if (s.d != 64 && s.d != 128) return false;
  for (const Tensor* t : ts)
    if (t->dtype() == DType::kFloat32 || !Aligned16(*t)) return false;
  return true;
}

template <typename Kernel>
void AllowSmem(Kernel kernel, size_t bytes) {
  Check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
        "cudaFuncSetAttribute (attention's shared memory)");
}

template <typename T, int D>
void LaunchFlashForward(const T* q, const T* k, const T* v, T* out, float* lse, const Dims& s) {
  constexpr int MT = kForwardMTiles<D>;
  constexpr size_t smem = FlashForwardSmem<T, D, MT>();
  static const bool allowed = (AllowSmem(FlashForwardKernel<T, D, MT>, smem), true);
  (void)allowed;
  const dim3 grid(static_cast<unsigned>(s.n),
                  static_cast<unsigned>((s.sq + kForwardRows<MT> - 1) / kForwardRows<MT>));
  FlashForwardKernel<T, D, MT><<<grid, kFlashThreads, smem, CurrentStream()>>>(q, k, v, out, lse, s);
  CheckLaunch("FlashForwardKernel");
}

template <typename T, int D>
void LaunchFlashBackward(const T* qp, const T* kp, const T* vp, const float* lp, const float* dp, const T* gp,
                         T* dq, T* dk, T* dv, const Dims& s) {
  constexpr size_t kv_smem = FlashBackwardKvSmem<T, D>(), q_smem = FlashBackwardQSmem<T, D>();
  static const bool allowed =
      (AllowSmem(FlashBackwardKvKernel<T, D>, kv_smem), AllowSmem(FlashBackwardQKernel<T, D>, q_smem), true);
  (void)allowed;
  const dim3 kv_grid(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sk + kBc - 1) / kBc));
  FlashBackwardKvKernel<T, D>
      <<<kv_grid, kFlashThreads, kv_smem, CurrentStream()>>>(qp, kp, vp, lp, dp, gp, dk, dv, s);
  CheckLaunch("FlashBackwardKvKernel");
  const dim3 q_grid(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sq + kBr - 1) / kBr));
  FlashBackwardQKernel<T, D>
      <<<q_grid, kFlashThreads, q_smem, CurrentStream()>>>(qp, kp, vp, lp, dp, gp, dq, s);
  CheckLaunch("FlashBackwardQKernel");
}

// The flash forward at head size s.d (64 or 128).
template <typename T>
void FlashForward(const T* q, const T* k, const T* v, T* out, float* lse, const Dims& s) {
  if (s.d == 64) return LaunchFlashForward<T, 64>(q, k, v, out, lse, s);
  LaunchFlashForward<T, 128>(q, k, v, out, lse, s);
}

// The flash backward: the row term, then the two gradient kernels. `delta`
// holds s.n * s.sq floats.
template <typename T>
void FlashBackward(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout,
                   float* delta, T* dq, T* dk, T* dv, const Dims& s) {
  const int64_t rows = s.n * s.sq;
  RowDotKernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, CurrentStream()>>>(dout, out, delta, s);
  CheckLaunch("RowDotKernel");
  if (s.d == 64) return LaunchFlashBackward<T, 64>(q, k, v, lse, delta, dout, dq, dk, dv, s);
  LaunchFlashBackward<T, 128>(q, k, v, lse, delta, dout, dq, dk, dv, s);
}

template <typename T>
const T* Ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <typename T>
T* MutablePtr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

Tensor LseLike(const Tensor& q) {
  std::vector<int64_t> dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  return Tensor::Empty(Shape(dims), DType::kFloat32, q.device());
}

// The Dims of q, k and v inside x [b, s, heads, 3 d] and of an output
// [b, s, heads, d] (qkv_attention's layouts); nullopt unless the
// tensor-core kernels take them.
std::optional<Dims> PackedFlashDims(const Tensor& x, const Tensor& out, const AttentionOptions& o) {
  const Shape parts = cpu::SplitQkvPartShape(x.shape());  // [b, heads, s, d]; checks x
  const int64_t heads = parts[1], sq = parts[2], d = parts[3];
  Dims s{parts[0] * heads, sq, sq, static_cast<int>(d), o.scale, o.causal, o.causal_shift, {}, {}, {}, {}};
  if (s.n == 0 || sq == 0 || !UsesFlashTiles(s, {&x, &out})) return std::nullopt;
  TESSEL_CHECK(sq <= 4 * 65535LL) << "qkv_attention: " << sq << " positions; the CUDA kernels take up to "
                                  << 4 * 65535LL;
  s.lq = s.lk = s.lv =
      RowLayout::Packed(heads, sq, 3 * d, 3 * heads * d);  // q, k and v side by side per head
  s.lo = RowLayout::Packed(heads, sq, d, heads * d);
  return s;
}

dim3 RowGrid(const Dims& s) {
  return dim3(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sq + kRowWarps - 1) / kRowWarps));
}

}  // namespace

std::vector<Tensor> Attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const Dims s = CheckedDims("attention", q, k, v, o);
  Tensor out = Tensor::Empty(q.shape(), q.dtype(), q.device());
  Tensor lse = LseLike(q);
  if (s.n == 0 || s.sq == 0) return {out, lse};
  VisitFloat("attention", q.dtype(), [&]<typename T>(TypeTag<T>) {
    if constexpr (!std::is_same_v<T, float>) {
      if (UsesFlashTiles(s, {&q, &k, &v, &out}))
        return FlashForward<T>(Ptr<T>(q), Ptr<T>(k), Ptr<T>(v), MutablePtr<T>(out), MutablePtr<float>(lse),
                               s);
    }
    RowForwardKernel<T><<<RowGrid(s), 32 * kRowWarps, 0, CurrentStream()>>>(
        static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
        static_cast<const T*>(v.raw_data()), static_cast<T*>(out.raw_data()),
        static_cast<float*>(lse.raw_data()), s);
    CheckLaunch("RowForwardKernel");
  });
  return {out, lse};
}

std::vector<Tensor> AttentionGrad(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const AttentionOptions& o) {
  const Dims s = CheckedDims("attention_grad", q, k, v, o);
  TESSEL_CHECK(out.shape() == q.shape() && dout.shape() == q.shape() && out.dtype() == q.dtype() &&
               dout.dtype() == q.dtype() && lse.dtype() == DType::kFloat32 && lse.numel() == s.n * s.sq)
      << "attention_grad: out " << out.ToString() << ", lse " << lse.ToString() << ", dout "
      << dout.ToString() << " for q " << q.ToString()
      << "; expected out and dout like q and one f32 lse per query";
  CheckOnDevice("attention_grad", q.device(), {out, lse, dout});
  Tensor dq = Tensor::Empty(q.shape(), q.dtype(), q.device());
  Tensor dk = Tensor::Empty(k.shape(), k.dtype(), k.device());
  Tensor dv = Tensor::Empty(v.shape(), v.dtype(), v.device());
  if (s.n == 0 || s.sk == 0) {
    Zero(dq);
    Zero(dk);
    Zero(dv);
    return {dq, dk, dv};
  }
  VisitFloat("attention_grad", q.dtype(), [&]<typename T>(TypeTag<T>) {
    if constexpr (!std::is_same_v<T, float>) {
      if (UsesFlashTiles(s, {&q, &k, &v, &out, &dout, &dk, &dv})) {
        Tensor delta = LseLike(q);
        return FlashBackward<T>(Ptr<T>(q), Ptr<T>(k), Ptr<T>(v), Ptr<T>(out), Ptr<float>(lse), Ptr<T>(dout),
                                MutablePtr<float>(delta), MutablePtr<T>(dq), MutablePtr<T>(dk),
                                MutablePtr<T>(dv), s);
      }
    }
    Tensor dk_acc = Tensor::Empty(k.shape(), DType::kFloat32, k.device()),
           dv_acc = Tensor::Empty(v.shape(), DType::kFloat32, v.device());
    Zero(dk_acc);
    Zero(dv_acc);
    RowBackwardKernel<T><<<RowGrid(s), 32 * kRowWarps, 0, CurrentStream()>>>(
        static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
        static_cast<const T*>(v.raw_data()), static_cast<const T*>(out.raw_data()),
        static_cast<const float*>(lse.raw_data()), static_cast<const T*>(dout.raw_data()),
        static_cast<T*>(dq.raw_data()), static_cast<float*>(dk_acc.raw_data()),
        static_cast<float*>(dv_acc.raw_data()), s);
    CheckLaunch("RowBackwardKernel");
    for (auto [src, dst] : {std::pair{&dk_acc, &dk}, std::pair{&dv_acc, &dv}}) {
      CastF32Kernel<T><<<Blocks(dst->numel()), kThreads, 0, CurrentStream()>>>(
          static_cast<const float*>(src->raw_data()), static_cast<T*>(dst->raw_data()), dst->numel());
      CheckLaunch("CastF32Kernel");
    }
  });
  return {dq, dk, dv};
}

std::vector<Tensor> QkvAttention(const Tensor& x, const AttentionOptions& o) {
  const Shape parts = cpu::SplitQkvPartShape(x.shape());
  CheckOnDevice("qkv_attention", x.device(), {x});
  SetDevice(x.device());
  const int64_t b = parts[0], heads = parts[1], sq = parts[2], d = parts[3];
  Tensor out = Tensor::Empty(Shape({b, sq, heads, d}), x.dtype(), x.device());
  Tensor lse = Tensor::Empty(Shape({b, heads, sq}), DType::kFloat32, x.device());
  if (const std::optional<Dims> s = PackedFlashDims(x, out, o)) {
    VisitFloat("qkv_attention", x.dtype(), [&]<typename T>(TypeTag<T>) {
      const T* q = Ptr<T>(x);
      FlashForward<T>(q, q + d, q + 2 * d, MutablePtr<T>(out), MutablePtr<float>(lse), *s);
    });
    return {out, lse};
  }
  // Other dtypes and head sizes: the parts apart, and the output permuted.
  const std::vector<Tensor> qkv = SplitQkv(x);
  const std::vector<Tensor> r = cuda::Attention(qkv[0], qkv[1], qkv[2], o);
  return {Permute(r[0], {0, 2, 1, 3}), r[1]};
}

Tensor QkvAttentionGrad(const Tensor& x, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const AttentionOptions& o) {
  const Shape parts = cpu::SplitQkvPartShape(x.shape());
  const int64_t b = parts[0], heads = parts[1], sq = parts[2], d = parts[3];
  const Shape out_shape({b, sq, heads, d});
  TESSEL_CHECK(out.shape() == out_shape && dout.shape() == out_shape && out.dtype() == x.dtype() &&
               dout.dtype() == x.dtype() && lse.dtype() == DType::kFloat32 &&
               lse.shape() == Shape({b, heads, sq}))
      << "qkv_attention_grad: out " << out.ToString() << ", lse " << lse.ToString() << ", dout "
      << dout.ToString() << " for x " << x.ToString() << "; expected out and dout " << out_shape << " in "
      << x.dtype() << " and an f32 lse [" << b << ", " << heads << ", " << sq << "]";
  CheckOnDevice("qkv_attention_grad", x.device(), {x, out, lse, dout});
  SetDevice(x.device());
  if (const std::optional<Dims> s = PackedFlashDims(x, out, o); s && UsesFlashTiles(*s, {&dout})) {
    Tensor dx = Tensor::Empty(x.shape(), x.dtype(), x.device());
    Tensor delta = Tensor::Empty(lse.shape(), DType::kFloat32, x.device());
    VisitFloat("qkv_attention_grad", x.dtype(), [&]<typename T>(TypeTag<T>) {
      const T* q = Ptr<T>(x);
      T* dq = MutablePtr<T>(dx);
      FlashBackward<T>(q, q + d, q + 2 * d, Ptr<T>(out), Ptr<float>(lse), Ptr<T>(dout),
                       MutablePtr<float>(delta), dq, dq + d, dq + 2 * d, *s);
    });
    return dx;
  }
  const std::vector<Tensor> qkv = SplitQkv(x);
  const std::vector<Tensor> g = cuda::AttentionGrad(qkv[0], qkv[1], qkv[2], Permute(out, {0, 2, 1, 3}), lse,
                                                    Permute(dout, {0, 2, 1, 3}), o);
  return MergeQkv(g[0], g[1], g[2]);
}

}  // namespace tessel::cuda
