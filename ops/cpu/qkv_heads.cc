#include "ops/cpu/qkv_heads.h"

#include <array>
#include <cstring>

#include "core/error.h"
#include "ops/cpu/parallel_for.h"

namespace tessel::cpu {

namespace {

// Copies each (batch, position, head)'s three runs of d elements between x
// and q, k, v (x to the parts when `split`).
void CopyQkv(const Tensor& x, const std::array<Tensor, 3>& parts, bool split) {
  const Shape& p = parts[0].shape();  // [b, heads, s, d]
  const int64_t b = p[0], heads = p[1], s = p[2];
  const size_t run = static_cast<size_t>(p[3]) * ElementSize(x.dtype());
  const int64_t rows = b * s * heads;
  auto* xb = static_cast<char*>(x.raw_data());
  std::array<char*, 3> pb;
  for (int i = 0; i < 3; ++i) pb[i] = static_cast<char*>(parts[i].raw_data());
  // r = (batch, position, head), x's order; copies of a few KiB in all are
  // not worth waking the threads.
  const bool parallel = static_cast<size_t>(rows) * run * 3 > (size_t{1} << 17);
  ParallelFor(rows, parallel, [&](int64_t r) {
    const int64_t bi = r / (s * heads), si = r / heads % s, hi = r % heads;
    const size_t offset = static_cast<size_t>((bi * heads + hi) * s + si) * run;
    for (int i = 0; i < 3; ++i) {
      char* xr = xb + (static_cast<size_t>(r) * 3 + i) * run;
      if (split) {
        std::memcpy(pb[i] + offset, xr, run);
      } else {
        std::memcpy(xr, pb[i] + offset, run);
      }
    }
  });
}

}  // namespace

Shape SplitQkvPartShape(const Shape& x) {
  TESSEL_CHECK(x.ndim() == 4 && x[3] % 3 == 0)
      << "split_qkv: x " << x << "; expected [batch, seq, heads, 3 * head_size]";
  return Shape({x[0], x[2], x[1], x[3] / 3});
}

Shape MergeQkvShape(const std::array<Shape, 3>& parts, const std::array<DType, 3>& dtypes) {
  const Shape& q = parts[0];
  TESSEL_CHECK(q.ndim() == 4 && parts[1] == q && parts[2] == q && dtypes[1] == dtypes[0] &&
               dtypes[2] == dtypes[0])
      << "merge_qkv: q " << dtypes[0] << " " << q << ", k " << dtypes[1] << " " << parts[1] << ", v "
      << dtypes[2] << " " << parts[2] << "; expected one dtype and shape [batch, heads, seq, head_size]";
  return Shape({q[0], q[2], q[1], 3 * q[3]});
}

std::vector<Tensor> SplitQkv(const Tensor& x) {
  const Shape part = SplitQkvPartShape(x.shape());
  std::array<Tensor, 3> parts;
  for (Tensor& t : parts) t = Tensor::Empty(part, x.dtype(), x.device());
  CopyQkv(x, parts, /*split=*/true);
  return {parts[0], parts[1], parts[2]};
}

Tensor MergeQkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  Tensor x =
      Tensor::Empty(MergeQkvShape({q.shape(), k.shape(), v.shape()}, {q.dtype(), k.dtype(), v.dtype()}),
                    q.dtype(), q.device());
  CopyQkv(x, {q, k, v}, /*split=*/false);
  return x;
}

}  // namespace tessel::cpu
