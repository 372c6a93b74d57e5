#include "sbp/slice.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace tessel {

Range BalancedPart(Range range, int64_t parts, int64_t index) {
  TESSEL_CHECK(parts > 0 && index >= 0 && index < parts)
      << "balanced split asked for part " << index << " of " << parts;
  int64_t q = range.size() / parts, r = range.size() % parts;
  int64_t begin = range.begin + index * q + std::min(index, r);
  return {begin, begin + q + (index < r ? 1 : 0)};
}

std::vector<Range> BalancedSplit(int64_t size, int64_t parts) {
  std::vector<Range> out;
  for (int64_t i = 0; i < parts; ++i) out.push_back(BalancedPart({0, size}, parts, i));
  return out;
}

Box Box::Full(const Shape& shape) {
  std::vector<Range> r;
  for (int64_t d : shape.dims()) r.push_back({0, d});
  return Box(std::move(r));
}

Shape Box::shape() const {
  std::vector<int64_t> dims;
  for (const Range& r : ranges_) dims.push_back(std::max<int64_t>(r.size(), 0));
  return Shape(std::move(dims));
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (const Range& r : ranges_) n *= std::max<int64_t>(r.size(), 0);
  return n;
}

Box Box::Intersect(const Box& other) const {
  Box out = *this;
  for (int64_t d = 0; d < ndim(); ++d) {
    out[d].begin = std::max(ranges_[d].begin, other[d].begin);
    out[d].end = std::max(out[d].begin, std::min(ranges_[d].end, other[d].end));
  }
  return out;
}

std::vector<int64_t> Box::OffsetIn(const Box& outer) const {
  std::vector<int64_t> off;
  for (int64_t d = 0; d < ndim(); ++d) off.push_back(ranges_[d].begin - outer[d].begin);
  return off;
}

std::string Box::ToString() const {
  std::ostringstream os;
  os << "[";
  for (int64_t d = 0; d < ndim(); ++d) os << (d ? ", " : "") << ranges_[d].begin << ":" << ranges_[d].end;
  os << "]";
  return os.str();
}

bool Box::operator<(const Box& o) const {
  for (int64_t d = 0; d < std::min(ndim(), o.ndim()); ++d) {
    if (ranges_[d].begin != o[d].begin) return ranges_[d].begin < o[d].begin;
    if (ranges_[d].end != o[d].end) return ranges_[d].end < o[d].end;
  }
  return ndim() < o.ndim();
}

Box SliceOf(const Shape& logical, const NdSbp& nd_sbp, const std::vector<int64_t>& hierarchy,
            const std::vector<int64_t>& coord) {
  Box box = Box::Full(logical);
  for (int a = 0; a < nd_sbp.size(); ++a) {
    if (nd_sbp[a].is_split()) {
      int d = nd_sbp[a].axis();
      box[d] = BalancedPart(box[d], hierarchy[a], coord[a]);
    }
  }
  return box;
}

}  // namespace tessel
