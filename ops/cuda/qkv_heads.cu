#include <cstdint>

#include "ops/cpu/qkv_heads.h"
#include "ops/cuda/cuda_util.cuh"
#include "ops/cuda/qkv_heads.h"

namespace tessel::cuda {

namespace {

template <typename U>
struct Parts {
  U* p[3];
};

// Unit i of x [b, s, heads, 3, units] <-> q, k, v [b, heads, s, units]
// (units: d elements in words of U); x to the parts when kSplit.
template <typename U, bool kSplit>
__global__ void CopyQkvKernel(U* __restrict__ x, Parts<U> parts, int64_t s, int64_t heads, int64_t units,
                              int64_t total) {
  TESSEL_CUDA_GRID_LOOP(i, total) {
    const int64_t u = i % units, rest = i / units;
    const int64_t part = rest % 3, r = rest / 3;  // r = (batch, position, head)
    const int64_t hi = r % heads, si = r / heads % s, bi = r / (heads * s);
    U* p = parts.p[part] + ((bi * heads + hi) * s + si) * units + u;
    if constexpr (kSplit) {
      *p = x[i];
    } else {
      x[i] = *p;
    }
  }
}

template <typename U, bool kSplit>
void Launch(const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape& p = q.shape();  // [b, heads, s, d]
  const int64_t units = p[3] * static_cast<int64_t>(ElementSize(q.dtype())) / static_cast<int64_t>(sizeof(U));
  const int64_t total = p[0] * p[1] * p[2] * 3 * units;
  if (total == 0) return;
  const Parts<U> parts{
      {static_cast<U*>(q.raw_data()), static_cast<U*>(k.raw_data()), static_cast<U*>(v.raw_data())}};
  CopyQkvKernel<U, kSplit><<<Blocks(total), kThreads, 0, CurrentStream()>>>(static_cast<U*>(x.raw_data()),
                                                                            parts, p[2], p[1], units, total);
  CheckLaunch(kSplit ? "split_qkv" : "merge_qkv");
}

template <bool kSplit>
void Copy(const Tensor& x, const Tensor& q, const Tensor& k, const Tensor& v) {
  const size_t run = static_cast<size_t>(q.shape()[3]) * ElementSize(q.dtype());
  bool aligned = run % 16 == 0;
  for (const Tensor* t : {&x, &q, &k, &v})
    aligned = aligned && reinterpret_cast<uintptr_t>(t->raw_data()) % 16 == 0;
  if (aligned) return Launch<uint4, kSplit>(x, q, k, v);
  switch (ElementSize(q.dtype())) {
    case 1:
      return Launch<uint8_t, kSplit>(x, q, k, v);
    case 2:
      return Launch<uint16_t, kSplit>(x, q, k, v);
    case 4:
      return Launch<uint32_t, kSplit>(x, q, k, v);
    default:
      return Launch<uint64_t, kSplit>(x, q, k, v);
  }
}

}  // namespace

std::vector<Tensor> SplitQkv(const Tensor& x) {
  const Shape part = cpu::SplitQkvPartShape(x.shape());
  SetDevice(x.device());
  Tensor q = Tensor::Empty(part, x.dtype(), x.device()), k = Tensor::Empty(part, x.dtype(), x.device()),
         v = Tensor::Empty(part, x.dtype(), x.device());
  Copy<true>(x, q, k, v);
  return {q, k, v};
}

Tensor MergeQkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Shape shape =
      cpu::MergeQkvShape({q.shape(), k.shape(), v.shape()}, {q.dtype(), k.dtype(), v.dtype()});
  CheckOnDevice("merge_qkv", q.device(), {k, v});
  SetDevice(q.device());
  Tensor x = Tensor::Empty(shape, q.dtype(), q.device());
  Copy<false>(x, q, k, v);
  return x;
}

}  // namespace tessel::cuda
