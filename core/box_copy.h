// Copies an N-D box of elements between two contiguous (row-major) buffers
// of possibly different shapes: the packing primitive of boxing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tessel {

// Copies the box of extent `box` starting at `src_offset` in a buffer of
// shape `src_shape` to `dst_offset` in a buffer of shape `dst_shape`.
// All vectors have the same length (the tensor rank); host memory only.
void CopyBox(const void* src, const std::vector<int64_t>& src_shape, const std::vector<int64_t>& src_offset,
             void* dst, const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_offset,
             const std::vector<int64_t>& box, size_t element_size);

// Calls visit(byte_offset, bytes) for each contiguous run of bytes of the
// box of extent `box` at `offset` in a row-major buffer of shape `shape`, in
// the box's own row-major order (so the runs, concatenated, are the box as a
// contiguous tensor). Trailing dimensions the box spans whole are one run.
// Lets a writer checksum or write a box without copying it first.
void ForEachRun(const std::vector<int64_t>& shape, const std::vector<int64_t>& offset,
                const std::vector<int64_t>& box, size_t element_size,
                const std::function<void(int64_t byte_offset, size_t bytes)>& visit);

}  // namespace tessel
