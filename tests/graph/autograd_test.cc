// Autograd semantics: accumulation into .grad, no_grad, the graph released
// after backward, shared inputs, and the errors for misuse.
#include "graph/autograd.h"

#include <gtest/gtest.h>

#include "ops/functional.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

using testing::ErrorOf;

std::vector<float> Values(const Tensor& t) { return t.detach().ToVector<float>(); }

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = Tensor::FromVector<float>({1, -2, 3}, {3}).set_requires_grad(true);
  fn::sum(fn::mul(x, x), {}).backward();  // d/dx sum(x^2) = 2x
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{2, -4, 6}));
  fn::sum(fn::mul_scalar(x, 3.0), {}).backward();  // + 3
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{5, -1, 9}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, SharedInputsSumTheirPaths) {
  Tensor x = Tensor::FromVector<float>({0.5f, 2}, {2}).set_requires_grad(true);
  Tensor y = fn::add(fn::mul(x, x), x);  // x feeds two ops: 2x + 1
  fn::sum(y, {}).backward();
  EXPECT_EQ(Values(x.grad()), (std::vector<float>{2, 5}));
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = randn({4}, 1).set_requires_grad(true);
  Tensor y;
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(GradModeEnabled());
    y = fn::mul(x, x);
  }
  EXPECT_TRUE(GradModeEnabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(fn::mul(x, x).requires_grad());
  EXPECT_FALSE(fn::mul(x.detach(), x.detach()).requires_grad());
}

TEST(Autograd, GraphIsReleasedAfterBackward) {
  Tensor x = randn({3}, 2).set_requires_grad(true);
  Tensor loss = fn::sum(fn::gelu(x), {});
  loss.backward();
  EXPECT_NE(ErrorOf([&] { loss.backward(); }).find("a second time"), std::string::npos);
}

TEST(Autograd, MisuseIsNamed) {
  Tensor x = randn({2, 3}, 3).set_requires_grad(true);
  EXPECT_NE(ErrorOf([&] { fn::mul(x, x).backward(); }).find("needs a scalar; got shape [2, 3]"),
            std::string::npos);
  Tensor y = fn::mul(x, x);
  y.backward(ones({2, 3}));  // an explicit gradient works for any shape
  EXPECT_EQ(Values(x.grad()), Values(fn::mul_scalar(x, 2.0)));
  EXPECT_NE(ErrorOf([] { randn({2}, 1).backward(); }).find("does not require grad"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              Tensor::FromVector<int64_t>({1}, {1}).set_requires_grad(true);
            }).find("only floating tensors can require gradients"),
            std::string::npos);
}

}  // namespace
}  // namespace tessel
