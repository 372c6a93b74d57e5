// Dropout draws its mask from Philox keyed by logical position (PyTorch's
// RNG differs, so the mask is checked against its definition directly).
#include <gtest/gtest.h>

#include "core/philox.h"
#include "graph/autograd.h"
#include "ops/functional.h"

namespace tessel {
namespace {

TEST(Dropout, MaskFollowsPhiloxAndScales) {
  const double p = 0.3;
  Tensor x = randn({64, 33}, 5);
  x.set_requires_grad(true);
  Tensor y = fn::dropout(x, p, /*seed=*/42, /*offset=*/1000);
  Philox gen(42);
  const float* in = x.detach().data<float>();
  const float* out = y.detach().data<float>();
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    bool keep = gen.Uniform(1000 + static_cast<uint64_t>(i)) >= p;
    kept += keep;
    ASSERT_EQ(out[i], keep ? in[i] * static_cast<float>(1.0 / (1.0 - p)) : 0.0f) << i;
  }
  EXPECT_NEAR(static_cast<double>(kept) / x.numel(), 1 - p, 0.03);
  // The gradient uses the same mask and scale.
  fn::sum(y, {}).backward();
  const float* g = x.grad().data<float>();
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(g[i], out[i] == 0.0f && in[i] != 0.0f ? 0.0f : static_cast<float>(1.0 / (1.0 - p)));
  // p = 0 is the identity; p outside [0, 1) is an error.
  EXPECT_EQ(fn::dropout(x.detach(), 0.0, 1).ToVector<float>(), x.detach().ToVector<float>());
  EXPECT_THROW(fn::dropout(x.detach(), 1.0, 1), Error);
}

}  // namespace
}  // namespace tessel
