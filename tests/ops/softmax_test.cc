// The CPU softmax's rows that are not plain: a NaN score, every visible
// score -inf, every key masked, a huge finite score. Its exponentials go
// through oneDNN, whose exp clamps its argument, so these rows take the
// element-wise path and give what PyTorch and the GPU kernels give.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/functional.h"

namespace tessel {
namespace {

TEST(Softmax, RowsWithNaNInfOrNoVisibleKeyGiveTorchsValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::FromVector<float>({1,    2,     3,    4,     // plain
                                              1,    nan,   3,    4,     // a NaN: all NaN
                                              -inf, -inf,  -inf, -inf,  // every score -inf: all NaN
                                              1,    2,     inf,  4,     // +inf: NaN
                                              0,    1e30f, 0,    0},    // huge but finite: one-hot
                                             Shape{5, 4});
  const std::vector<float> y = fn::softmax(x).ToVector<float>();
  double plain = 0;
  for (int c = 0; c < 4; ++c) plain += std::exp(c + 1.0);
  for (int c = 0; c < 4; ++c) EXPECT_NEAR(y[c], std::exp(c + 1.0) / plain, 1e-6) << c;
  for (int c = 4; c < 16; ++c) EXPECT_TRUE(std::isnan(y[c])) << c << ": " << y[c];
  EXPECT_EQ(std::vector<float>(y.begin() + 16, y.end()), (std::vector<float>{0, 1, 0, 0}));
  // Every key masked (a causal row of a shard past its keys, a padding row): zeros.
  const Tensor mask = Tensor::FromVector<bool>({false, false, false, false}, Shape{1, 4});
  const std::vector<float> masked =
      fn::scale_mask_softmax(fn::slice(x, 0, 0, 1), mask, 1.0, false).ToVector<float>();
  EXPECT_EQ(masked, (std::vector<float>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace tessel
