// Slice arithmetic: which part of a logical tensor each mesh index holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"
#include "sbp/sbp.h"

namespace tessel {

// Half-open [begin, end) along one dimension.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Part `index` of `parts` balanced parts of `range`: sizes differ by at most
// one and the larger parts come first.
Range BalancedPart(Range range, int64_t parts, int64_t index);
std::vector<Range> BalancedSplit(int64_t size, int64_t parts);

// An axis-aligned box of a logical tensor: one Range per dimension.
class Box {
 public:
  Box() = default;
  explicit Box(std::vector<Range> ranges) : ranges_(std::move(ranges)) {}
  static Box Full(const Shape& shape);

  int64_t ndim() const { return static_cast<int64_t>(ranges_.size()); }
  const Range& operator[](int64_t d) const { return ranges_[d]; }
  Range& operator[](int64_t d) { return ranges_[d]; }
  Shape shape() const;
  int64_t numel() const;
  bool empty() const { return numel() == 0; }
  // The overlap of two boxes (possibly empty).
  Box Intersect(const Box& other) const;
  // Offsets of this box's corner relative to `outer`'s corner.
  std::vector<int64_t> OffsetIn(const Box& outer) const;
  std::string ToString() const;  // "[0:4, 0:5, 0:3]"
  bool operator==(const Box&) const = default;
  bool operator<(const Box& o) const;

 private:
  std::vector<Range> ranges_;
};

// The box held at mesh coordinate `coord` of `hierarchy` under `nd_sbp`:
// split axes cut, from the outermost mesh axis in; B and P keep the range.
Box SliceOf(const Shape& logical, const NdSbp& nd_sbp, const std::vector<int64_t>& hierarchy,
            const std::vector<int64_t>& coord);

}  // namespace tessel
