// Autograd semantics: accumulation into .grad, no_grad, the graph released
// after backward, shared inputs, and the errors for misuse.
#include "graph/autograd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/functional.h"
#include "ops/op_def.h"
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

// An op registered without a gradient function (nor a mark that it has
// none by design): the first used with a tensor that requires gradients.
const OpDef& GradlessSquare() {
  static const bool registered = [] {
    OpDef def;
    def.name = "test_gradless_square";
    def.inputs = {"x"};
    def.infer = [](const std::vector<TensorSpec>& in, const Attrs&) {
      return std::vector<TensorSpec>{in[0]};
    };
    def.kernels[DeviceType::kCPU] = [](const KernelContext& ctx) {
      return std::vector<Tensor>{fn::mul(ctx.inputs[0], ctx.inputs[0])};
    };
    RegisterOp(std::move(def));
    return true;
  }();
  (void)registered;
  return GetOpDef("test_gradless_square");
}

TEST(Autograd, BackwardThroughAnOpWithoutGradientFailsNamingIt) {
  GradlessSquare();
  Tensor w = randn({3}, 4).set_requires_grad(true);
  Tensor other = randn({3}, 5).set_requires_grad(true);
  // The path through the op needs a gradient: refused, naming op and input.
  Tensor squared = ApplyOp("test_gradless_square", {w}).at(0);
  const std::string error = ErrorOf([&] { fn::sum(fn::add(squared, other), {}).backward(); });
  EXPECT_NE(error.find("op 'test_gradless_square' has no gradient function"), std::string::npos) << error;
  EXPECT_NE(error.find("input 'x'"), std::string::npos) << error;
  // A detached input takes no path back: allowed.
  Tensor loss = fn::sum(fn::add(ApplyOp("test_gradless_square", {w.detach()}).at(0), other), {});
  loss.backward();
  EXPECT_TRUE(other.grad().defined());
  // An output that never reaches the loss is no error either.
  other.zero_grad();
  Tensor unused = ApplyOp("test_gradless_square", {w}).at(0);
  fn::sum(other, {}).backward();
  EXPECT_EQ(Values(other.grad()), (std::vector<float>{1, 1, 1}));
}

// Every registered op has a gradient function, is marked not differentiable
// (its outputs are constants to autograd by design), says why it has no
// gradient (gradient ops), or updates its inputs in place (optimizers).
TEST(Autograd, EveryRegisteredOpHasAGradientOrIsMarkedNotDifferentiable) {
  std::vector<std::string> missing;
  for (const std::string& name : RegisteredOps()) {
    if (name.rfind("test_", 0) == 0) continue;  // ops the tests register
    const OpDef& def = GetOpDef(name);
    if (!def.grad && !def.not_differentiable && def.grad_unsupported.empty() && def.mutates.empty())
      missing.push_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "ops with neither a gradient nor a not-differentiable mark: "
                               << ::testing::PrintToString(missing);
}

// expand's gradient: the sum over the added and the stretched axes.
TEST(Autograd, ExpandGradientSumsTheBroadcastAxes) {
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3, 1}).set_requires_grad(true);
  // [3, 1] -> [2, 3, 4]: axis 0 added, axis 2 stretched from 1 to 4.
  Tensor y =
      ApplyOp("expand", {x}, {{"shape", std::vector<int64_t>{2, 3, 4}}, {"axes", std::vector<int64_t>{0}}})
          .at(0);
  Tensor weights = arange({2, 3, 4});
  fn::sum(fn::mul(y, weights), {}).backward();
  // d/dx[i] = the sum over a and k of weights[a, i, k].
  std::vector<float> want(3, 0.0f);
  for (int a = 0; a < 2; ++a)
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 4; ++k) want[i] += static_cast<float>(a * 12 + i * 4 + k);
  EXPECT_EQ(x.grad().shape(), Shape({3, 1}));
  EXPECT_EQ(Values(x.grad()), want);
}

}  // namespace
}  // namespace tessel
