#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/philox.h"
#include "tests/testing/test_util.h"

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

// A Tensor is a handle: one pointer to an implementation, so copies are
// cheap and share data, kind and autograd state.
TEST(TensorHandle, IsOnePointerToAnImplementation) {
  EXPECT_EQ(sizeof(Tensor), sizeof(std::shared_ptr<TensorImpl>));
  Tensor a = arange({2, 3});
  Tensor b = a;
  EXPECT_EQ(a.impl_ptr(), b.impl_ptr());
  EXPECT_EQ(a.kind(), TensorKind::kLocal);
  EXPECT_FALSE(a.is_lazy());
  EXPECT_FALSE(a.is_global());
  // detach() and Reshape() are new handles on the same storage.
  Tensor d = a.detach();
  EXPECT_NE(d.impl_ptr(), a.impl_ptr());
  EXPECT_EQ(d.raw_data(), a.raw_data());
  EXPECT_EQ(a.Reshape({3, 2}).raw_data(), a.raw_data());
  EXPECT_EQ(a.to_local().impl_ptr(), a.impl_ptr());  // a local tensor is its own shard
}

TEST(TensorHandle, UndefinedTensorsSayWhatIsMissing) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_FALSE(u.is_lazy());
  EXPECT_FALSE(u.is_global());
  EXPECT_EQ(u.raw_data(), nullptr);
  EXPECT_EQ(u.ToString(), "Tensor(undefined)");
  EXPECT_NE(testing::ErrorOf([&] { u.shape(); }).find("undefined tensor"), std::string::npos);
  EXPECT_NE(testing::ErrorOf([&] { u.data<float>(); }).find("undefined tensor"), std::string::npos);
}

// A lazy tensor: shape, dtype and device without storage. Everything that
// reads data refuses it by name; metadata reads work.
TEST(TensorHandle, LazyTensorsHaveMetadataAndNoData) {
  Tensor l = Tensor::Lazy({5, 7}, DType::kBFloat16);
  EXPECT_TRUE(l.defined());
  EXPECT_TRUE(l.is_lazy());
  EXPECT_EQ(l.kind(), TensorKind::kLazy);
  EXPECT_EQ(l.shape(), (Shape{5, 7}));
  EXPECT_EQ(l.numel(), 35);
  EXPECT_EQ(l.dtype(), DType::kBFloat16);
  EXPECT_TRUE(l.device().is_cpu());
  EXPECT_EQ(l.nbytes(), 0u);
  EXPECT_EQ(l.raw_data(), nullptr);
  EXPECT_EQ(l.lazy_value(), nullptr);
  EXPECT_EQ(l.ToString(), "Tensor(bf16, [5, 7], cpu, lazy)");
  EXPECT_EQ(l.to_local().impl_ptr(), l.impl_ptr());
  for (auto [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"data access", [&] { l.data<BFloat16>(); }},
           {"Clone()", [&] { l.Clone(); }},
           {"Reshape()", [&] { l.Reshape({35}); }},
           {"To()", [&] { l.To(Device::CPU()); }},
           {"CopyFrom()", [&] {
              l.CopyFrom(zeros({5, 7}, DType::kBFloat16));
            }}}) {
    std::string msg = testing::ErrorOf(fn);
    EXPECT_NE(msg.find(what + " of a lazy tensor"), std::string::npos) << msg;
  }
  // detach keeps it lazy; metadata_only of eager data is lazy.
  EXPECT_TRUE(l.detach().is_lazy());
  Tensor m = arange({3}).metadata_only();
  EXPECT_TRUE(m.is_lazy());
  EXPECT_EQ(m.shape(), (Shape{3}));
}

}  // namespace
}  // namespace tessel
