// Swapping two dimensions into a new contiguous tensor.
#pragma once

#include "core/tensor.h"

namespace tessel::cpu {

Tensor Transpose(const Tensor& x, int64_t dim0, int64_t dim1);

}  // namespace tessel::cpu
