// Tensor shapes: a list of non-negative dimension sizes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace tessel {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::vector<int64_t> dims);

  int64_t ndim() const { return static_cast<int64_t>(dims_.size()); }
  // Dimension `axis`; negative axes count from the end, as in PyTorch.
  int64_t operator[](int64_t axis) const { return dims_[NormalizeAxis(axis)]; }
  int64_t& at(int64_t axis) { return dims_[NormalizeAxis(axis)]; }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  // Row-major (contiguous) strides in elements.
  std::vector<int64_t> ContiguousStrides() const;
  // Maps a possibly negative axis to [0, ndim); throws naming axis and shape.
  int64_t NormalizeAxis(int64_t axis) const;

  std::string ToString() const;  // "[7, 5, 3]"
  bool operator==(const Shape&) const = default;

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace tessel
