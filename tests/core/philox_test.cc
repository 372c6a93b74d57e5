#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tessel {
namespace {

// Known-answer vectors published with the Random123 library (kat_vectors,
// philox4x32 with 10 rounds).
TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(Philox::Rounds10({0, 0, 0, 0}, {0, 0}),
            (Philox::Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      Philox::Rounds10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (Philox::Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      Philox::Rounds10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (Philox::Counter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, ValueDependsOnlyOnSeedAndOffset) {
  Philox gen(1234);
  std::vector<float> whole(1001);
  gen.FillUniform(whole.data(), 1001, 0);
  // Any slice drawn alone equals the same slice of the whole.
  for (uint64_t start : {0u, 1u, 3u, 4u, 5u, 997u}) {
    std::vector<float> part(4);
    Philox(1234).FillUniform(part.data(), 4, start);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(part[i], whole[start + i]) << start;
  }
  EXPECT_NE(Philox(1235).Uniform(0), whole[0]);
}

TEST(Philox, UniformAndNormalMoments) {
  Philox gen(7);
  const int n = 200000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = gen.Uniform(i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    su2 += u * u;
    float z = gen.Normal(i);
    ASSERT_TRUE(std::isfinite(z));
    sn += z;
    sn2 += z * z;
  }
  // Standard errors at n=2e5 are ~6e-4 (uniform mean) and ~2e-3 (normal mean).
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(su2 / n - (su / n) * (su / n), 1.0 / 12.0, 0.003);
  EXPECT_NEAR(sn / n, 0.0, 0.02);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
}

}  // namespace
}  // namespace tessel
