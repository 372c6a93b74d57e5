// Copies an N-D box of elements between two contiguous (row-major) buffers
// of possibly different shapes: the packing primitive of boxing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tessel {

// Copies the box of extent `box` starting at `src_offset` in a buffer of
// shape `src_shape` to `dst_offset` in a buffer of shape `dst_shape`.
// All vectors have the same length (the tensor rank); host memory only.
void CopyBox(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_offset,
             void* dst, const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_offset,
             const std::vector<int64_t>& box, size_t element_size);

}  // namespace tessel
