#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace tessel {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(ElementSize(DType::kFloat32), 4u);
  EXPECT_EQ(ElementSize(DType::kFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kInt32), 4u);
  EXPECT_EQ(ElementSize(DType::kInt64), 8u);
  EXPECT_EQ(ElementSize(DType::kBool), 1u);
  for (DType d : kAllDTypes) EXPECT_EQ(ParseDType(DTypeName(d)), d);
  EXPECT_EQ(ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBFloat16);
}

TEST(DType, UnknownNameIsNamedInError) {
  try {
    ParseDType("f8");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'f8'"), std::string::npos) << e.what();
  }
}

TEST(Half, Float16ExactValuesAndRounding) {
  // IEEE binary16 encodings.
  EXPECT_EQ(Float16(1.0f).bits, 0x3C00);
  EXPECT_EQ(Float16(-2.0f).bits, 0xC000);
  EXPECT_EQ(Float16(65504.0f).bits, 0x7BFF);               // largest finite
  EXPECT_EQ(Float16(65520.0f).bits, 0x7C00);               // rounds to +inf
  EXPECT_EQ(Float16(std::ldexp(1.0f, -24)).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(Float16(std::ldexp(1.0f, -14)).bits, 0x0400);  // smallest normal
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1.0).
  EXPECT_EQ(Float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3C00);
  EXPECT_EQ(Float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3C02);
  EXPECT_TRUE(std::isnan(static_cast<float>(Float16(std::numeric_limits<float>::quiet_NaN()))));
  // Every finite half round-trips through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    Float16 x;
    x.bits = static_cast<uint16_t>(h);
    ASSERT_EQ(Float16(static_cast<float>(x)).bits, h) << std::hex << h;
  }
}

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(BFloat16(-1.0f).bits, 0xBF80);
  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even is 1.
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);
  EXPECT_EQ(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3F82);
  EXPECT_EQ(static_cast<float>(BFloat16(3.0f)), 3.0f);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace tessel
