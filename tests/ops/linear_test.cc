// The linear ops at the edges PyTorch parity does not reach: a shard with no
// rows (a micro-batch a data-parallel rank holds none of) and no input
// features give zero gradients of the right shapes, and bad shapes name
// every operand.
#include <gtest/gtest.h>

#include "graph/autograd.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

TEST(LinearOps, NoRowsGiveZeroParameterGradients) {
  const Tensor x = zeros({0, 3, 4}), dy = zeros({0, 3, 5});
  const std::vector<Tensor> g = fn::linear_weight_grad(x, dy);
  ASSERT_EQ(g[0].shape(), Shape({4, 5}));
  ASSERT_EQ(g[1].shape(), Shape({5}));
  for (const Tensor& t : g)
    for (float v : t.ToVector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(LinearOps, NoInputFeaturesGiveTheBias) {
  const Tensor x = zeros({2, 3, 0}), w = zeros({0, 5}), b = randn({5}, 1);
  const Tensor y = fn::linear(x, w, b);
  ASSERT_EQ(y.shape(), Shape({2, 3, 5}));
  const std::vector<float> bias = b.ToVector<float>(), out = y.ToVector<float>();
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], bias[i % 5]);
  const std::vector<Tensor> g = fn::linear_weight_grad(x, randn({2, 3, 5}, 2));
  EXPECT_EQ(g[0].shape(), Shape({0, 5}));
  EXPECT_EQ(g[1].shape(), Shape({5}));
}

TEST(LinearOps, BadShapesNameTheOperands) {
  std::string e = testing::ErrorOf([] { fn::linear(randn({2, 4}, 1), randn({3, 5}, 2), randn({5}, 3)); });
  EXPECT_NE(e.find("expected x [..., k], weight [k, n] and bias [n]; got x [2, 4], weight [3, 5] and bias [5]"),
            std::string::npos)
      << e;
  e = testing::ErrorOf(
      [] { fn::linear_residual(randn({2, 4}, 1), randn({4, 5}, 2), randn({5}, 3), randn({2, 4}, 4)); });
  EXPECT_NE(e.find("the residual is [2, 4]; expected the output's [2, 5]"), std::string::npos) << e;
  e = testing::ErrorOf([] { fn::linear_weight_grad(randn({2, 4}, 1), randn({3, 5}, 2)); });
  EXPECT_NE(e.find("must agree on every dimension but the last; got x [2, 4] and dy [3, 5]"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace tessel
