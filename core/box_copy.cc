#include "core/box_copy.h"

#include <cstring>

#include "core/error.h"

namespace tessel {

namespace {
struct BoxCopier {
  const char* src;
  char* dst;
  std::vector<int64_t> src_stride, dst_stride, box;  // strides in bytes
  int64_t inner_dims;                                // trailing dims copied as one run
  size_t run_bytes;

  void Copy(int64_t dim, const char* s, char* d) const {
    if (dim == inner_dims) {
      std::memcpy(d, s, run_bytes);
      return;
    }
    for (int64_t i = 0; i < box[dim]; ++i) Copy(dim + 1, s + i * src_stride[dim], d + i * dst_stride[dim]);
  }
};
}  // namespace

void CopyBox(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_offset,
             void* dst, const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_offset,
             const std::vector<int64_t>& box, size_t element_size) {
  const int64_t n = static_cast<int64_t>(box.size());
  TESSEL_CHECK(static_cast<int64_t>(src_shape.size()) == n && static_cast<int64_t>(dst_shape.size()) == n &&
               static_cast<int64_t>(src_offset.size()) == n && static_cast<int64_t>(dst_offset.size()) == n)
      << "CopyBox needs shapes, offsets and box of one rank";
  for (int64_t d = 0; d < n; ++d) {
    if (box[d] == 0) return;
    TESSEL_CHECK(src_offset[d] >= 0 && src_offset[d] + box[d] <= src_shape[d] && dst_offset[d] >= 0 &&
                 dst_offset[d] + box[d] <= dst_shape[d])
        << "CopyBox: box extent " << box[d] << " at dimension " << d << " does not fit (source offset "
        << src_offset[d] << " of " << src_shape[d] << ", destination offset " << dst_offset[d] << " of "
        << dst_shape[d] << ")";
  }
  BoxCopier c;
  c.box = box;
  c.src_stride.assign(n, 0);
  c.dst_stride.assign(n, 0);
  int64_t ss = static_cast<int64_t>(element_size), ds = ss;
  for (int64_t d = n - 1; d >= 0; --d) {
    c.src_stride[d] = ss;
    c.dst_stride[d] = ds;
    ss *= src_shape[d];
    ds *= dst_shape[d];
  }
  int64_t src_start = 0, dst_start = 0;
  for (int64_t d = 0; d < n; ++d) {
    src_start += src_offset[d] * c.src_stride[d];
    dst_start += dst_offset[d] * c.dst_stride[d];
  }
  // Merge trailing dimensions that are whole in both buffers into one run.
  c.inner_dims = n;
  c.run_bytes = element_size;
  while (c.inner_dims > 0) {
    int64_t d = c.inner_dims - 1;
    c.run_bytes *= static_cast<size_t>(box[d]);
    --c.inner_dims;
    if (box[d] != src_shape[d] || box[d] != dst_shape[d]) break;
  }
  c.src = static_cast<const char*>(src) + src_start;
  c.dst = static_cast<char*>(dst) + dst_start;
  c.Copy(0, c.src, c.dst);
}

void ForEachRun(const std::vector<int64_t>& shape, const std::vector<int64_t>& offset,
                const std::vector<int64_t>& box, size_t element_size,
                const std::function<void(int64_t byte_offset, size_t bytes)>& visit) {
  const int64_t n = static_cast<int64_t>(box.size());
  TESSEL_CHECK(static_cast<int64_t>(shape.size()) == n && static_cast<int64_t>(offset.size()) == n)
      << "ForEachRun needs shape, offset and box of one rank";
  for (int64_t d = 0; d < n; ++d) {
    if (box[d] == 0) return;
    TESSEL_CHECK(offset[d] >= 0 && offset[d] + box[d] <= shape[d])
        << "ForEachRun: box extent " << box[d] << " at dimension " << d << " does not fit (offset "
        << offset[d] << " of " << shape[d] << ")";
  }
  std::vector<int64_t> stride(n, 0);
  int64_t s = static_cast<int64_t>(element_size), start = 0;
  for (int64_t d = n - 1; d >= 0; --d) {
    stride[d] = s;
    s *= shape[d];
  }
  for (int64_t d = 0; d < n; ++d) start += offset[d] * stride[d];
  // Trailing dimensions whole in the buffer merge into the run.
  int64_t inner = n;
  size_t run = element_size;
  while (inner > 0) {
    const int64_t d = inner - 1;
    run *= static_cast<size_t>(box[d]);
    --inner;
    if (box[d] != shape[d]) break;
  }
  std::vector<int64_t> index(inner, 0);
  while (true) {
    int64_t at = start;
    for (int64_t d = 0; d < inner; ++d) at += index[d] * stride[d];
    visit(at, run);
    int64_t d = inner - 1;
    while (d >= 0 && ++index[d] == box[d]) index[d--] = 0;
    if (d < 0) break;
  }
}

}  // namespace tessel
