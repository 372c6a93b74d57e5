#include "tools/train/task.h"

#include "graph/global_tensor_ops.h"
#include "layers/dist.h"

namespace tessel::train {

BatchLayout BatchLayout::ForWorld(int64_t rows) {
  return {.rows = rows,
          .dp = dist::GetConfig().data_parallel_size,
          .first = dist::GetLayerPlacement(0),
          .last = dist::GetLayerPlacement(-1),
          .sbp = dist::GetHiddenSbp()};
}

int BatchLayout::DataParallelIndex() const {
  const int64_t tp = dist::GetConfig().tensor_parallel_size;
  return static_cast<int>(dist::Rank() % (dp * tp) / tp);
}

int64_t BatchLayout::FirstRow(int part, int parts) const {
  return DataParallelIndex() * (rows / dp) + part * LocalRows(parts);
}

bool BatchLayout::ReadsInputs() const { return first.Contains(dist::Rank()); }
bool BatchLayout::ReadsLabels() const { return last.Contains(dist::Rank()); }

Tensor BatchLayout::OnFirst(const Tensor& local, const Shape& global_shape) const {
  return FromLocal(local, first, sbp, global_shape);
}
Tensor BatchLayout::OnLast(const Tensor& local, const Shape& global_shape) const {
  return FromLocal(local, last, sbp, global_shape);
}

}  // namespace tessel::train
