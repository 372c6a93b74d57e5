#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/philox.h"

namespace tessel {
namespace {

TEST(Tensor, EmptyAndFactories) {
  Tensor t = zeros({7, 5, 3}, DType::kInt64);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.nbytes(), 105u * 8);
  for (int64_t v : t.ToVector<int64_t>()) EXPECT_EQ(v, 0);
  Tensor a = arange({2, 3});
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  Tensor f = full({3}, 2.5, DType::kBFloat16);
  for (BFloat16 v : f.ToVector<BFloat16>()) EXPECT_EQ(static_cast<float>(v), 2.5f);
  EXPECT_EQ(ones({2}, DType::kInt32).ToVector<int32_t>(), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(t.ToString(), "Tensor(i64, [7, 5, 3], cpu)");
}

TEST(Tensor, SharingCloneReshape) {
  Tensor a = arange({4});
  Tensor alias = a;
  Tensor copy = a.Clone();
  a.data<float>()[0] = 42;
  EXPECT_EQ(alias.data<float>()[0], 42);
  EXPECT_EQ(copy.data<float>()[0], 0);
  Tensor r = a.Reshape({2, 2});
  EXPECT_EQ(r.shape(), (Shape{2, 2}));
  EXPECT_EQ(r.raw_data(), a.raw_data());
  EXPECT_THROW(a.Reshape({3}), Error);
}

TEST(Tensor, WrongDTypeAccessIsAnError) {
  Tensor t = zeros({2});
  try {
    t.data<int64_t>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data<i64>() on a tensor of dtype f32"), std::string::npos);
  }
  EXPECT_THROW(Tensor::FromVector<float>({1, 2, 3}, {2, 2}), Error);
}

TEST(Tensor, RandomSlicesMatchTheWhole) {
  Tensor whole = rand({10, 7}, 99);
  Tensor rows = rand({3, 7}, 99, /*offset=*/4 * 7);  // rows 4..6 alone
  for (int i = 0; i < 21; ++i) EXPECT_EQ(rows.data<float>()[i], whole.data<float>()[28 + i]);
  Tensor n = randn({5}, 3);
  EXPECT_EQ(n.data<float>()[2], Philox(3).Normal(2));
  EXPECT_THROW(rand({2}, 1, 0, DType::kInt32), Error);
}

}  // namespace
}  // namespace tessel
