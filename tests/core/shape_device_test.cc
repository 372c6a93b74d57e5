#include <gtest/gtest.h>

#include "core/device.h"
#include "core/error.h"
#include "core/shape.h"

namespace tessel {
namespace {

TEST(Shape, NumelStridesAxes) {
  Shape s{7, 5, 3};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 105);
  EXPECT_EQ(s.ContiguousStrides(), (std::vector<int64_t>{15, 3, 1}));
  EXPECT_EQ(s[-1], 3);
  EXPECT_EQ(s.NormalizeAxis(-3), 0);
  EXPECT_EQ(s.ToString(), "[7, 5, 3]");
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar has one element
  EXPECT_EQ((Shape{4, 0}.numel()), 0);
}

TEST(Shape, BadInputNamesValues) {
  try {
    Shape{7, 5, 3}.NormalizeAxis(3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("axis 3 is out of range for shape [7, 5, 3]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((Shape{2, -1}), Error);
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::Parse("cpu"), Device::CPU());
  EXPECT_EQ(Device::Parse("cuda:3"), Device::CUDA(3));
  EXPECT_EQ(Device::Parse("cuda"), Device::CUDA(0));
  EXPECT_EQ(Device::CUDA(1).ToString(), "cuda:1");
  EXPECT_THROW(Device::Parse("tpu"), Error);
  EXPECT_THROW(Device::Parse("cuda:x"), Error);
  EXPECT_THROW(Device::Parse("cuda:-1"), Error);
}

}  // namespace
}  // namespace tessel
