#include "core/shape.h"

#include <sstream>

#include "core/error.h"

namespace tessel {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  for (size_t i = 0; i < dims_.size(); ++i) {
    TESSEL_CHECK(dims_[i] >= 0) << "shape " << ToString() << " has negative size " << dims_[i]
                                << " at dimension " << i << "; sizes must be >= 0";
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

std::vector<int64_t> Shape::ContiguousStrides() const {
  std::vector<int64_t> strides(dims_.size(), 1);
  for (int64_t i = ndim() - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims_[i + 1];
  return strides;
}

int64_t Shape::NormalizeAxis(int64_t axis) const {
  int64_t n = ndim();
  TESSEL_CHECK_CODE(axis >= -n && axis < n, StatusCode::kOutOfRange)
      << "axis " << axis << " is out of range for shape " << ToString() << " (expected " << -n
      << " <= axis < " << n << ")";
  return axis < 0 ? axis + n : axis;
}

std::string Shape::ToString() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape.ToString(); }

}  // namespace tessel
