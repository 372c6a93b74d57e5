#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <type_traits>

#include "ops/cuda/attention.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/row_util.cuh"

namespace tessel::cuda {
namespace {

namespace wmma = nvcuda::wmma;

struct Dims {
  int64_t n, sq, sk;
  int d;
  float scale;
  bool causal;
  int64_t shift;  // key j visible to local query i when j <= i + shift (causal)
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

constexpr int kBr = 64, kBc = 64;   // query rows and key rows per tile
constexpr int kFlashThreads = 128;  // four warps, each owning 16 query (or key) rows of a tile

// Shared-memory rows are padded (16 bytes for the 16-bit tiles, 16 bytes for
// the f32 ones) so that the 16 rows a fragment reads start in different
// banks. Every fragment pointer stays 32-byte aligned: it starts at a
// multiple of 16 rows and 16 columns.
template <int kWidth>
constexpr int kLdHalf = kWidth + 8;  // a 16-bit tile kWidth wide
template <int kWidth>
constexpr int kLdF32 = kWidth + 4;  // an f32 tile kWidth wide

// Loads rows [row0, row0 + 64) of a [rows, D] matrix into a padded tile as
// 16-byte vectors, zeros past `rows`.
template <typename T, int D>
__device__ __forceinline__ void LoadTile(T* dst, const T* src, int64_t row0, int64_t rows) {
  constexpr int kVecPerRow = D * sizeof(T) / 16;
  for (int x = threadIdx.x; x < 64 * kVecPerRow; x += kFlashThreads) {
    const int r = x / kVecPerRow, c = x % kVecPerRow;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + r < rows) val = reinterpret_cast<const uint4*>(src + (row0 + r) * D)[c];
    reinterpret_cast<uint4*>(dst + r * kLdHalf<D>)[c] = val;
  }
}

// c[16 x 64] (f32, ld ldc) = a[16 x D] b^T, with a 16 rows of a padded
// D-wide tile and b 64 rows of another (b[n][x] is element (x, n) of b^T).
template <typename T, int D>
__device__ __forceinline__ void WarpRowsTimesRowsT(float* c, int ldc, const T* a, const T* b) {
  constexpr int ld = kLdHalf<D>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) wmma::fill_fragment(acc[j], 0.0f);
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    wmma::load_matrix_sync(fa, a + kk, ld);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wmma::load_matrix_sync(fb, b + 16 * j * ld + kk, ld);
      wmma::mma_sync(acc[j], fa, fb, acc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) wmma::store_matrix_sync(c + 16 * j, acc[j], ldc, wmma::mem_row_major);
}

// c[16 x D] (f32, padded D-wide rows) (+)= A[16 x 64] b[64 x D], b a padded
// D-wide tile. A is 16 rows of the padded 64-wide tile `a` or, with
// kATransposed, 16 of its columns (the rows of its transpose: `a` points at
// the first column).
template <typename T, int D, bool kATransposed>
__device__ __forceinline__ void WarpTimesTile(float* c, const T* a, const T* b, bool accumulate) {
  using ALayout = std::conditional_t<kATransposed, wmma::col_major, wmma::row_major>;
  constexpr int lda = kLdHalf<64>, ldb = kLdHalf<D>, ldc = kLdF32<D>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, ALayout> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    if (accumulate) {
      wmma::load_matrix_sync(acc, c + 16 * j, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(acc, 0.0f);
    }
#pragma unroll
    for (int kk = 0; kk < 64; kk += 16) {
      // Row-major A: element (r, kk + x) at a[r * lda + kk + x]. Transposed:
      // at a[(kk + x) * lda + r], which is a col-major tile.
      wmma::load_matrix_sync(fa, kATransposed ? a + kk * lda : a + kk, lda);
      wmma::load_matrix_sync(fb, b + kk * ldb + 16 * j, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + 16 * j, acc, ldc, wmma::mem_row_major);
  }
}

template <typename T, int D>
constexpr size_t FlashForwardSmem() {
  // q, k, v tiles and the probabilities (T); scores and the output
  // accumulator (f32); the running max and sum per row.
  return (3 * 64 * kLdHalf<D> + 64 * kLdHalf<64>)*sizeof(T) +
         (64 * kLdF32<64> + 64 * kLdF32<D> + 2 * 64) * sizeof(float);
}

// One block: 64 query rows of one (batch, head); loops over key tiles with
// the running maximum and sum per row (FlashAttention's forward).
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    FlashForwardKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       T* __restrict__ out, float* __restrict__ lse, Dims s) {
  constexpr int ldt = kLdHalf<D>, ldp = kLdHalf<64>, lds = kLdF32<64>, ldo = kLdF32<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* ks = qs + 64 * ldt;
  T* vs = ks + 64 * ldt;
  T* ps = vs + 64 * ldt;
  float* ss = reinterpret_cast<float*>(ps + 64 * ldp);
  float* os = ss + 64 * lds;
  float* row_max = os + 64 * ldo;
  float* row_sum = row_max + 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x, q0 = static_cast<int64_t>(blockIdx.y) * kBr;
  const T *qb = q + b * s.sq * D, *kb = k + b * s.sk * D, *vb = v + b * s.sk * D;
  LoadTile<T, D>(qs, qb, q0, s.sq);
  for (int x = threadIdx.x; x < 64 * ldo; x += kFlashThreads) os[x] = 0.0f;
  if (threadIdx.x < 64) {
    row_max[threadIdx.x] = -INFINITY;
    row_sum[threadIdx.x] = 0.0f;
  }
  const int64_t key_end = KeyEnd(s, q0 + kBr - 1);
  for (int64_t k0 = 0; k0 < key_end; k0 += kBc) {
    __syncthreads();  // the last tile's readers are done with ks and vs
    LoadTile<T, D>(ks, kb, k0, s.sk);
    LoadTile<T, D>(vs, vb, k0, s.sk);
    __syncthreads();
    // Each warp owns query rows [16 warp, 16 warp + 16) of ss, ps and os.
    WarpRowsTimesRowsT<T, D>(ss + 16 * warp * lds, lds, qs + 16 * warp * ldt, ks);
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int r = 16 * warp + rr;
      const int64_t i = q0 + r;
      float x[2];
      float mx = -INFINITY;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int c = lane + 32 * t;
        x[t] = Visible(s, i, k0 + c) ? ss[r * lds + c] * s.scale : -INFINITY;
        mx = fmaxf(mx, x[t]);
      }
      mx = WarpAllReduce(mx, MaxOp{});
      const float m_old = row_max[r], m_new = fmaxf(m_old, mx);
      // A row with nothing visible yet keeps zeros (and no NaN from -inf - -inf).
      const float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
      float psum = 0.0f;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const float p = m_new == -INFINITY ? 0.0f : __expf(x[t] - m_new);
        psum += p;
        ps[r * ldp + lane + 32 * t] = FromF32<T>(p);
      }
      psum = WarpAllReduce(psum, SumOp{});
      for (int c = lane; c < D; c += 32) os[r * ldo + c] *= alpha;
      if (lane == 0) {
        row_max[r] = m_new;
        row_sum[r] = row_sum[r] * alpha + psum;
      }
    }
    __syncwarp();
    WarpTimesTile<T, D, false>(os + 16 * warp * ldo, ps + 16 * warp * ldp, vs, /*accumulate=*/true);
  }
  __syncthreads();  // with no key tile at all, the zeros written by other warps
  for (int rr = 0; rr < 16; ++rr) {
    const int r = 16 * warp + rr;
    const int64_t i = q0 + r;
    if (i >= s.sq) break;
    const float l = row_sum[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int c = lane; c < D; c += 32) out[(b * s.sq + i) * D + c] = FromF32<T>(os[r * ldo + c] * inv);
    if (lane == 0) lse[b * s.sq + i] = l > 0.0f ? row_max[r] + logf(l) : INFINITY;
  }
}

// delta[row] = sum_c dout[row][c] * out[row][c] (the backward's row term).
template <typename T>
__global__ void RowDotKernel(const T* __restrict__ a, const T* __restrict__ b, float* __restrict__ dot,
                             int64_t rows, int d) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float acc = 0.0f;
  for (int c = lane; c < d; c += 32) acc += ToF32(a[row * d + c]) * ToF32(b[row * d + c]);
  acc = WarpAllReduce(acc, SumOp{});
  if (lane == 0) dot[row] = acc;
}

// p = exp(scale s - lse) and ds = p (dp - delta) of the 16 query rows a warp
// owns (rows [16 warp, 16 warp + 16) of the tiles), masked to 0, stored in
// the dtype for the tensor-core products. With kTransposedOut they are
// written transposed ([key][query]), as the key-side products read them.
template <typename T>
__device__ __forceinline__ void WarpProbsAndDs(T* ps, T* dss, const float* ss, const float* dps,
                                               const float* lse_s, const float* delta_s, const Dims& s,
                                               int64_t q0, int64_t k0, int warp, int lane) {
  constexpr int ldp = kLdHalf<64>, lds = kLdF32<64>;
  for (int rr = 0; rr < 16; ++rr) {
    const int r = 16 * warp + rr;
    const int64_t i = q0 + r;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int c = lane + 32 * t;
      const bool seen = i < s.sq && Visible(s, i, k0 + c);
      const float p = seen ? __expf(ss[r * lds + c] * s.scale - lse_s[r]) : 0.0f;
      if (ps != nullptr) ps[r * ldp + c] = FromF32<T>(p);
      dss[r * ldp + c] = FromF32<T>(p * (dps[r * lds + c] - delta_s[r]));
    }
  }
}

// Loads the lse and delta of query rows [q0, q0 + 64) (past sq: +inf and 0,
// so their probabilities are 0).
__device__ __forceinline__ void LoadRowTerms(float* lse_s, float* delta_s, const float* lse,
                                             const float* delta, int64_t b, int64_t q0, const Dims& s) {
  if (threadIdx.x < 64) {
    const int64_t i = q0 + threadIdx.x;
    lse_s[threadIdx.x] = i < s.sq ? lse[b * s.sq + i] : INFINITY;
    delta_s[threadIdx.x] = i < s.sq ? delta[b * s.sq + i] : 0.0f;
  }
}

template <typename T, int D>
constexpr size_t FlashBackwardKvSmem() {
  // k, v, q, dout tiles and p, ds (T); scores and dp (f32); dk and dv
  // accumulators (f32); lse and delta per row.
  return (4 * 64 * kLdHalf<D> + 2 * 64 * kLdHalf<64>)*sizeof(T) +
         (2 * 64 * kLdF32<64> + 2 * 64 * kLdF32<D> + 2 * 64) * sizeof(float);
}

// dk and dv. One block: 64 key rows of one (batch, head); loops over the
// query tiles that can see them, summing in shared memory
// (FlashAttention-2's backward, without its dq: see FlashBackwardQKernel).
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardKvKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          const T* __restrict__ dout, T* __restrict__ dk, T* __restrict__ dv, Dims s) {
  constexpr int ldt = kLdHalf<D>, ldp = kLdHalf<64>, lds = kLdF32<64>, ldo = kLdF32<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + 64 * ldt;
  T* qs = vs + 64 * ldt;
  T* gs = qs + 64 * ldt;  // dout
  T* ps = gs + 64 * ldt;
  T* dss = ps + 64 * ldp;
  float* ss = reinterpret_cast<float*>(dss + 64 * ldp);
  float* dps = ss + 64 * lds;
  float* dks = dps + 64 * lds;
  float* dvs = dks + 64 * ldo;
  float* lse_s = dvs + 64 * ldo;
  float* delta_s = lse_s + 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x, k0 = static_cast<int64_t>(blockIdx.y) * kBc;
  const T *qb = q + b * s.sq * D, *gb = dout + b * s.sq * D;
  LoadTile<T, D>(ks, k + b * s.sk * D, k0, s.sk);
  LoadTile<T, D>(vs, v + b * s.sk * D, k0, s.sk);
  for (int x = threadIdx.x; x < 64 * ldo; x += kFlashThreads) dks[x] = dvs[x] = 0.0f;
  // The first query that sees key k0: i + shift >= k0.
  int64_t q_begin = 0;
  if (s.causal && k0 - s.shift > 0) q_begin = (k0 - s.shift) / kBr * kBr;
  for (int64_t q0 = q_begin; q0 < s.sq; q0 += kBr) {
    __syncthreads();  // the last tile's readers are done with qs, gs, ps, dss
    LoadTile<T, D>(qs, qb, q0, s.sq);
    LoadTile<T, D>(gs, gb, q0, s.sq);
    LoadRowTerms(lse_s, delta_s, lse, delta, b, q0, s);
    __syncthreads();
    // Query rows [16 warp, 16 warp + 16): scores, dp = dout v^T, p and ds.
    WarpRowsTimesRowsT<T, D>(ss + 16 * warp * lds, lds, qs + 16 * warp * ldt, ks);
    WarpRowsTimesRowsT<T, D>(dps + 16 * warp * lds, lds, gs + 16 * warp * ldt, vs);
    __syncwarp();
    WarpProbsAndDs<T>(ps, dss, ss, dps, lse_s, delta_s, s, q0, k0, warp, lane);
    __syncthreads();  // every warp's p and ds rows are needed for dk and dv
    // Key rows [16 warp, 16 warp + 16): dv += p^T dout, dk += ds^T q.
    WarpTimesTile<T, D, true>(dvs + 16 * warp * ldo, ps + 16 * warp, gs, /*accumulate=*/true);
    WarpTimesTile<T, D, true>(dks + 16 * warp * ldo, dss + 16 * warp, qs, /*accumulate=*/true);
  }
  __syncthreads();
  for (int x = threadIdx.x; x < 64 * D; x += kFlashThreads) {
    const int r = x / D, c = x % D;
    if (k0 + r >= s.sk) continue;
    dk[(b * s.sk + k0) * D + x] = FromF32<T>(dks[r * ldo + c] * s.scale);
    dv[(b * s.sk + k0) * D + x] = FromF32<T>(dvs[r * ldo + c]);
  }
}

template <typename T, int D>
constexpr size_t FlashBackwardQSmem() {
  // q, dout, k, v tiles and ds (T); scores, dp and the dq accumulator (f32);
  // lse and delta per row.
  return (4 * 64 * kLdHalf<D> + 64 * kLdHalf<64>)*sizeof(T) +
         (2 * 64 * kLdF32<64> + 64 * kLdF32<D> + 2 * 64) * sizeof(float);
}

// dq. One block: 64 query rows of one (batch, head); loops over the key
// tiles they see, recomputing p and ds as the dk/dv kernel does (two more
// products per tile, instead of summing dq across blocks with atomics).
// Each warp owns 16 query rows of every per-row buffer, as in the forward.
template <typename T, int D>
__global__ void __launch_bounds__(kFlashThreads)
    FlashBackwardQKernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         const T* __restrict__ dout, T* __restrict__ dq, Dims s) {
  constexpr int ldt = kLdHalf<D>, ldp = kLdHalf<64>, lds = kLdF32<64>, ldo = kLdF32<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);
  T* gs = qs + 64 * ldt;  // dout
  T* ks = gs + 64 * ldt;
  T* vs = ks + 64 * ldt;
  T* dss = vs + 64 * ldt;
  float* ss = reinterpret_cast<float*>(dss + 64 * ldp);
  float* dps = ss + 64 * lds;
  float* dqs = dps + 64 * lds;
  float* lse_s = dqs + 64 * ldo;
  float* delta_s = lse_s + 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x, q0 = static_cast<int64_t>(blockIdx.y) * kBr;
  const T *kb = k + b * s.sk * D, *vb = v + b * s.sk * D;
  LoadTile<T, D>(qs, q + b * s.sq * D, q0, s.sq);
  LoadTile<T, D>(gs, dout + b * s.sq * D, q0, s.sq);
  LoadRowTerms(lse_s, delta_s, lse, delta, b, q0, s);
  for (int x = threadIdx.x; x < 64 * ldo; x += kFlashThreads) dqs[x] = 0.0f;
  const int64_t key_end = KeyEnd(s, q0 + kBr - 1);
  for (int64_t k0 = 0; k0 < key_end; k0 += kBc) {
    __syncthreads();  // the last tile's readers are done with ks and vs
    LoadTile<T, D>(ks, kb, k0, s.sk);
    LoadTile<T, D>(vs, vb, k0, s.sk);
    __syncthreads();
    WarpRowsTimesRowsT<T, D>(ss + 16 * warp * lds, lds, qs + 16 * warp * ldt, ks);
    WarpRowsTimesRowsT<T, D>(dps + 16 * warp * lds, lds, gs + 16 * warp * ldt, vs);
    __syncwarp();
    WarpProbsAndDs<T>(nullptr, dss, ss, dps, lse_s, delta_s, s, q0, k0, warp, lane);
    __syncwarp();
    WarpTimesTile<T, D, false>(dqs + 16 * warp * ldo, dss + 16 * warp * ldp, ks, /*accumulate=*/true);
  }
  __syncthreads();  // with no key tile at all, the zeros written by other warps
  for (int rr = 0; rr < 16; ++rr) {
    const int r = 16 * warp + rr;
    const int64_t i = q0 + r;
    if (i >= s.sq) break;
    for (int c = lane; c < D; c += 32) dq[(b * s.sq + i) * D + c] = FromF32<T>(dqs[r * ldo + c] * s.scale);
  }
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
  return {n, sq, sk, static_cast<int>(d), o.scale, o.causal, o.causal_shift};
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
void LaunchFlashForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Dims& s) {
  constexpr size_t smem = FlashForwardSmem<T, D>();
  static const bool allowed = (AllowSmem(FlashForwardKernel<T, D>, smem), true);
  (void)allowed;
  const dim3 grid(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sq + kBr - 1) / kBr));
  FlashForwardKernel<T, D><<<grid, kFlashThreads, smem, CurrentStream()>>>(
      static_cast<const T*>(q.raw_data()), static_cast<const T*>(k.raw_data()),
      static_cast<const T*>(v.raw_data()), static_cast<T*>(out.raw_data()),
      static_cast<float*>(lse.raw_data()), s);
  CheckLaunch("FlashForwardKernel");
}

template <typename T, int D>
void LaunchFlashBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                         const Tensor& delta, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                         const Tensor& dv, const Dims& s) {
  constexpr size_t kv_smem = FlashBackwardKvSmem<T, D>(), q_smem = FlashBackwardQSmem<T, D>();
  static const bool allowed =
      (AllowSmem(FlashBackwardKvKernel<T, D>, kv_smem), AllowSmem(FlashBackwardQKernel<T, D>, q_smem), true);
  (void)allowed;
  const auto* qp = static_cast<const T*>(q.raw_data());
  const auto* kp = static_cast<const T*>(k.raw_data());
  const auto* vp = static_cast<const T*>(v.raw_data());
  const auto* gp = static_cast<const T*>(dout.raw_data());
  const auto* lp = static_cast<const float*>(lse.raw_data());
  const auto* dp = static_cast<const float*>(delta.raw_data());
  const dim3 kv_grid(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sk + kBc - 1) / kBc));
  FlashBackwardKvKernel<T, D><<<kv_grid, kFlashThreads, kv_smem, CurrentStream()>>>(
      qp, kp, vp, lp, dp, gp, static_cast<T*>(dk.raw_data()), static_cast<T*>(dv.raw_data()), s);
  CheckLaunch("FlashBackwardKvKernel");
  const dim3 q_grid(static_cast<unsigned>(s.n), static_cast<unsigned>((s.sq + kBr - 1) / kBr));
  FlashBackwardQKernel<T, D><<<q_grid, kFlashThreads, q_smem, CurrentStream()>>>(
      qp, kp, vp, lp, dp, gp, static_cast<T*>(dq.raw_data()), s);
  CheckLaunch("FlashBackwardQKernel");
}

Tensor LseLike(const Tensor& q) {
  std::vector<int64_t> dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  return Tensor::Empty(Shape(dims), DType::kFloat32, q.device());
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
      if (UsesFlashTiles(s, {&q, &k, &v, &out})) {
        if (s.d == 64) return LaunchFlashForward<T, 64>(q, k, v, out, lse, s);
        return LaunchFlashForward<T, 128>(q, k, v, out, lse, s);
      }
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
        const int64_t rows = s.n * s.sq;
        RowDotKernel<T><<<static_cast<unsigned>((rows + 7) / 8), 256, 0, CurrentStream()>>>(
            static_cast<const T*>(dout.raw_data()), static_cast<const T*>(out.raw_data()),
            static_cast<float*>(delta.raw_data()), rows, s.d);
        CheckLaunch("RowDotKernel");
        if (s.d == 64) {
          LaunchFlashBackward<T, 64>(q, k, v, lse, delta, dout, dq, dk, dv, s);
        } else {
          LaunchFlashBackward<T, 128>(q, k, v, lse, delta, dout, dq, dk, dv, s);
        }
        return;
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

}  // namespace tessel::cuda
