// A two-layer tanh MLP (8 -> 16 -> 3) with a mean-square loss: the small
// trainable model the graph-step and actor-runtime tests capture.
#pragma once

#include "core/tensor.h"
#include "layers/optimizer.h"
#include "ops/functional.h"

namespace tessel::testing {

struct TinyMlp {
  Tensor w1 = randn({8, 16}, 1).set_requires_grad(true);
  Tensor w2 = randn({16, 3}, 2).set_requires_grad(true);
  optim::NamedParams params() { return {{"w1", &w1}, {"w2", &w2}}; }
  Tensor Loss(const Tensor& x) const {
    Tensor y = fn::matmul(fn::tanh(fn::matmul(x, w1)), w2);
    return fn::mean(fn::mul(y, y), {0, 1});
  }
};

}  // namespace tessel::testing
