// NumPy broadcasting: result shapes and the map from a result element to
// the element of a broadcast operand.
#pragma once

#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace tessel::cpu {

// The broadcast of two shapes; throws naming both if they do not broadcast.
Shape BroadcastShapes(const Shape& a, const Shape& b);

// Flat index of `operand` (broadcast to `result`) for a flat result index.
class BroadcastIndex {
 public:
  BroadcastIndex(const Shape& operand, const Shape& result);
  int64_t operator()(int64_t result_index) const;
  // True when the operand is the result's shape (index maps to itself).
  bool identity() const { return identity_; }
  // Operand step along the result's last dimension (1, or 0 if broadcast).
  int64_t inner_stride() const { return strides_.empty() ? 0 : strides_.back(); }

 private:
  std::vector<int64_t> result_dims_, strides_;  // operand strides per result dim (0 where broadcast)
  bool identity_ = false;
};

}  // namespace tessel::cpu
