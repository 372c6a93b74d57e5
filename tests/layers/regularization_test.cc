// Dropout and DropPath layers: identity in eval mode, fresh masks per call in
// training, DropPath dropping whole samples.
#include "layers/regularization.h"

#include <gtest/gtest.h>

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
