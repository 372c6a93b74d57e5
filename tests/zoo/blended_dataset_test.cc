#include "zoo/blended_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tests/testing/test_util.h"

namespace tessel::zoo {
namespace {

using testing::ErrorOf;

// Megatron-LM's --data-path 0.3 A 0.7 B over 10,000 samples: the mix is
// the weights' (every prefix within one sample of them), and each dataset's
// samples are taken in order, each once.
TEST(Blend, TakesEachDatasetInProportionToItsWeight) {
  const Blend blend({0.3, 0.7}, 10000, "data.blend");
  ASSERT_EQ(blend.size(), 10000);
  EXPECT_NEAR(blend.count(0), 3000, 1);
  EXPECT_EQ(blend.count(0) + blend.count(1), 10000);
  int64_t next[2] = {0, 0};
  for (int64_t i = 0; i < blend.size(); ++i) {
    const auto [d, j] = blend[i];
    ASSERT_EQ(j, next[d]) << "sample " << i;
    ++next[d];
    // After i + 1 samples dataset 0 holds within one of 30% of them.
    ASSERT_LE(std::abs(static_cast<double>(next[0]) - 0.3 * static_cast<double>(i + 1)), 1.0) << i;
  }
  // Weights are proportions of any scale.
  const Blend scaled({3, 7}, 10000, "data.blend");
  for (int64_t i = 0; i < 10000; ++i) ASSERT_EQ(scaled[i], blend[i]);
  const Blend three({1, 1, 2}, 1000, "data.blend");
  EXPECT_EQ(three.count(0), 250);
  EXPECT_EQ(three.count(1), 250);
  EXPECT_EQ(three.count(2), 500);
}

TEST(Blend, BadWeightsAreNamed) {
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    const std::string e = ErrorOf([&] { Blend({0.5, bad}, 10, "data.blend"); });
    EXPECT_NE(e.find("data.blend[1].weight is"), std::string::npos) << e;
  }
  EXPECT_NE(ErrorOf([] { Blend({}, 10, "data.blend"); }).find("0 datasets; expected 1 to 255"), std::string::npos);
  // An index that cannot fit is refused before it is built.
  const std::string e = ErrorOf([] { Blend({1, 1}, int64_t{1} << 60, "data.blend"); });
  EXPECT_NE(e.find("needs an index of"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessel::zoo
