// Parameters and optimizer states are variables: a step updates them in
// place (same storage, every handle sees the new value, still a leaf that
// requires gradients), and the in-place update ops refuse what would make
// them silently wrong. Values against torch.optim are in op_parity_test.
#include "layers/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "graph/autograd.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

namespace tessel {
namespace {

using testing::ErrorOf;

// loss = sum(w * w): the gradient is 2w.
void Backward(const Tensor& w) { fn::sum(fn::mul(w, w), {0, 1}).backward(); }

TEST(OptimizerVariables, AdamWAndSgdUpdateParametersInPlace) {
  const Placement one("cpu", {0});
  for (bool adamw : {true, false}) {
    Tensor w = randn({4, 3}, one, NdSbp{B()}, 5);
    w.set_requires_grad(true);
    const Tensor alias = w;  // another handle on the same variable
    const void* storage = w.to_local().raw_data();
    const std::vector<float> before = w.to_local().ToVector<float>();
    optim::NamedParams params = {{"w", &w}};
    optim::AdamW adam(params, {.lr = 0.1, .weight_decay = 0.0});
    optim::SGD sgd(params, 0.1, 0.9);
    for (int step = 0; step < 2; ++step) {
      Backward(w);
      adamw ? adam.Step() : sgd.Step();
    }
    EXPECT_EQ(w.to_local().raw_data(), storage) << (adamw ? "AdamW" : "SGD") << " replaced the parameter";
    EXPECT_EQ(alias.to_local().ToVector<float>(), w.to_local().ToVector<float>());
    EXPECT_NE(w.to_local().ToVector<float>(), before);
    EXPECT_TRUE(w.requires_grad());
    EXPECT_FALSE(w.grad().defined());
    if (!adamw) {
      // SGD with momentum 0.9, gradient 2w: v1 = 2w0, w1 = w0 - 0.1 v1;
      // v2 = 0.9 v1 + 2w1, w2 = w1 - 0.1 v2.
      const std::vector<float> after = w.to_local().ToVector<float>();
      for (size_t i = 0; i < before.size(); ++i) {
        const double w0 = before[i], v1 = 2 * w0, w1 = w0 - 0.1 * v1, v2 = 0.9 * v1 + 2 * w1;
        EXPECT_NEAR(after[i], w1 - 0.1 * v2, 1e-5) << "element " << i;
      }
    }
  }
}

TEST(OptimizerVariables, ParametersSharingMemoryAreRefused) {
  const Placement one("cpu", {0});
  Tensor w = randn({4, 3}, one, NdSbp{B()}, 5);
  Tensor tied = w;  // the same parameter under a second name
  const std::string error = ErrorOf([&] { optim::SGD sgd({{"wte", &w}, {"lm_head", &tied}}, 0.1); });
  EXPECT_NE(error.find("parameters 'wte' and 'lm_head' share memory"), std::string::npos) << error;
}

TEST(OptimizerVariables, InPlaceUpdateRefusesSharedMemory) {
  NoGradGuard no_grad;
  Tensor p = ones({3, 2}), g = ones({3, 2}), m = zeros({3, 2});
  const Tensor step = ReplicatedScalar(0, p, DType::kInt64), lr = ReplicatedScalar(0.1, p, DType::kFloat32);
  const std::string error = ErrorOf([&] { fn::adamw_update(p, g, m, m, step, lr, {}); });
  EXPECT_NE(error.find("'adamw_update' updates its input exp_avg in place, but it shares memory with input "
                       "exp_avg_sq"),
            std::string::npos)
      << error;
  // Nothing was written.
  EXPECT_EQ(p.ToVector<float>(), std::vector<float>(6, 1.0f));
}

TEST(OptimizerVariables, InPlaceUpdateOfATensorThatRequiresGradIsRefusedWhileRecording) {
  Tensor p = ones({3, 2});
  p.set_requires_grad(true);
  const std::string error = ErrorOf([&] {
    fn::sgd_update(p, ones({3, 2}), zeros({3, 2}), 0.1, 0.0, 0.0, true);
  });
  EXPECT_NE(error.find("'sgd_update' updates its input param in place, and that tensor requires gradients"),
            std::string::npos)
      << error;
  EXPECT_EQ(p.ToVector<float>(), std::vector<float>(6, 1.0f));
  // Under NoGradGuard (what the optimizers use) the same call updates p.
  NoGradGuard no_grad;
  fn::sgd_update(p, ones({3, 2}), zeros({3, 2}), 0.1, 0.0, 0.0, true);
  EXPECT_NEAR(p.ToVector<float>()[0], 0.9f, 1e-6);
}

}  // namespace
}  // namespace tessel
