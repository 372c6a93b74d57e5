// split_qkv and merge_qkv on CUDA devices (the semantics and the shape
// checks of ops/cpu/qkv_heads.h): one kernel each, 16 bytes per thread where the
// head size allows.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessel::cuda {

std::vector<Tensor> SplitQkv(const Tensor& x);
Tensor MergeQkv(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace tessel::cuda
