// Dropout and DropPath layers: identity in eval mode, fresh masks per call in
// training, DropPath dropping whole samples.
#include "layers/regularization.h"

#include <gtest/gtest.h>

#include <cmath>

#include "layers/dist.h"
#include "ops/functional.h"

namespace tessel {
namespace {

TEST(Regularization, DropoutTrainsAndEvals) {
  dist::Setup({});
  layers::Dropout drop(0.5, 9);
  Tensor x = ones({64, 16});
  Tensor a = drop(x), b = drop(x);
  EXPECT_NE(a.ToVector<float>(), b.ToVector<float>());  // the offset advances
  for (float v : a.ToVector<float>()) EXPECT_TRUE(v == 0.0f || v == 2.0f);
  EXPECT_EQ(a.ToVector<float>(), fn::dropout(x, 0.5, 9, 0).ToVector<float>());
  drop.Eval();
  EXPECT_EQ(drop(x).ToVector<float>(), x.ToVector<float>());
}

TEST(Regularization, DropoutDropsItsRateAndKeepsTheMean) {
  // Each element is dropped with probability p: over n elements the count
  // dropped is binomial, within 5 standard deviations of n p; the kept ones
  // are scaled by 1 / (1 - p), so the mean stays 1.
  dist::Setup({});
  const int64_t n = 256 * 256;
  for (double p : {0.1, 0.5, 0.9}) {
    layers::Dropout drop(p, 11);
    const std::vector<float> v = drop(ones({256, 256})).ToVector<float>();
    int64_t dropped = 0;
    double sum = 0;
    for (float x : v) {
      dropped += x == 0.0f;
      sum += x;
    }
    const double sigma = std::sqrt(static_cast<double>(n) * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(dropped), static_cast<double>(n) * p, 5 * sigma) << "p " << p;
    EXPECT_NEAR(sum / static_cast<double>(n), 1.0, 5 * sigma / static_cast<double>(n) / (1 - p)) << "p " << p;
  }
}

TEST(Regularization, DropPathDropsWholeSamples) {
  dist::Setup({});
  layers::DropPath path(0.5, 3);
  Tensor y = path(ones({32, 4, 5}));
  std::vector<float> v = y.ToVector<float>();
  int dropped = 0;
  for (int b = 0; b < 32; ++b) {
    float first = v[b * 20];
    EXPECT_TRUE(first == 0.0f || first == 2.0f);
    for (int i = 1; i < 20; ++i) ASSERT_EQ(v[b * 20 + i], first) << "sample " << b;
    dropped += first == 0.0f;
  }
  EXPECT_GT(dropped, 4);
  EXPECT_LT(dropped, 28);
  path.Eval();
  EXPECT_EQ(path(ones({3, 2})).ToVector<float>(), std::vector<float>(6, 1.0f));
}

}  // namespace
}  // namespace tessel
