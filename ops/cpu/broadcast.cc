#include "ops/cpu/broadcast.h"

#include <algorithm>

#include "core/error.h"

namespace tessel::cpu {

Shape BroadcastShapes(const Shape& a, const Shape& b) {
  const int64_t n = std::max(a.ndim(), b.ndim());
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.ndim() ? 1 : a.dims()[i - (n - a.ndim())];
    int64_t db = i < n - b.ndim() ? 1 : b.dims()[i - (n - b.ndim())];
    TESSEL_CHECK(da == db || da == 1 || db == 1)
        << "shapes " << a << " and " << b << " do not broadcast (dimension " << i - n << ": " << da << " vs "
        << db << ")";
    out[i] = std::max(da, db);
    if (da == 0 || db == 0) out[i] = 0;
  }
  return Shape(out);
}

BroadcastIndex::BroadcastIndex(const Shape& operand, const Shape& result) : result_dims_(result.dims()) {
  identity_ = operand == result;
  const int64_t n = result.ndim(), off = n - operand.ndim();
  strides_.assign(n, 0);
  int64_t stride = 1;
  for (int64_t i = operand.ndim() - 1; i >= 0; --i) {
    if (operand.dims()[i] != 1) strides_[i + off] = stride;
    stride *= operand.dims()[i];
  }
}

int64_t BroadcastIndex::operator()(int64_t result_index) const {
  if (identity_) return result_index;
  int64_t index = 0;
  for (int64_t d = static_cast<int64_t>(result_dims_.size()) - 1; d >= 0; --d) {
    int64_t coord = result_index % result_dims_[d];
    result_index /= result_dims_[d];
    index += coord * strides_[d];
  }
  return index;
}

}  // namespace tessel::cpu
