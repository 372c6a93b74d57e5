// Dropout draws its mask from Philox keyed by logical position (PyTorch's
// RNG differs, so the mask is checked against its definition directly).
// Its offset is a tensor that rng_offset reads and rng_advance moves on by
// the logical element count; on a GPU the mask, its gradient and the
// counter are the CPU's bit for bit ("skipped: no CUDA device" without one,
// TESSEL_REQUIRE_GPU=1 fails instead).
#include <gtest/gtest.h>

#include <string>

#include "core/philox.h"
#include "graph/autograd.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"
#ifdef TESSEL_HAS_CUDA
#include "tests/testing/gpu.h"
#endif

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

Tensor Counter(int64_t value) { return Tensor::FromVector<int64_t>({value}, Shape(std::vector<int64_t>{})); }

TEST(Dropout, TheOffsetIsATensorThatTheCounterOpsReadAndMoveOn) {
  const Tensor x = randn({6, 7}, 3);
  Tensor counter = Counter(1000);
  const Tensor offset = fn::rng_offset(counter, x);
  EXPECT_EQ(fn::rng_advance(counter, x).raw_data(), counter.raw_data());  // in place, the same tensor back
  EXPECT_EQ(counter.ToVector<int64_t>(), std::vector<int64_t>{1042});
  EXPECT_EQ(offset.ToVector<int64_t>(), std::vector<int64_t>{1000});  // a copy: the advance left it
  EXPECT_EQ(fn::dropout(x, offset, 0.3, 42).ToVector<float>(),
            fn::dropout(x, 0.3, 42, 1000).ToVector<float>());
  EXPECT_NE(fn::dropout(x, counter, 0.3, 42).ToVector<float>(),
            fn::dropout(x, offset, 0.3, 42).ToVector<float>());
  // Counters and offsets must be i64 scalars, named.
  std::string e = testing::ErrorOf([&] { fn::dropout(x, fn::reshape(Counter(1), Shape{1}), 0.3, 42); });
  EXPECT_NE(e.find("dropout's offset must be an i64 scalar; got i64 [1]"), std::string::npos) << e;
  e = testing::ErrorOf([&] { fn::rng_advance(zeros(Shape(std::vector<int64_t>{})), x); });
  EXPECT_NE(e.find("rng_advance: the counter must be an i64 scalar; got f32 []"), std::string::npos) << e;
}

#ifdef TESSEL_HAS_CUDA
// The kernel reads the offset on the device: the CPU's mask, forward and
// backward, for f32 and (rounded alike) bf16, in the vectorized and the
// element-wise paths (33 columns are not a multiple of 4).
TEST(Dropout, OnTheGpuTheMaskAndTheCounterAreTheCpus) {
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  const Device gpu = Device::CUDA(0);
  for (const Shape& shape : {Shape{64, 33}, Shape{16, 64}}) {
    Tensor x = randn(shape, 5).set_requires_grad(true);
    Tensor y = fn::dropout(x, Counter(1000), 0.3, 42);
    fn::sum(y, {}).backward();
    Tensor xd = x.detach().To(gpu).set_requires_grad(true);
    Tensor counter = Counter(1000).To(gpu);
    Tensor yd = fn::dropout(xd, fn::rng_offset(counter, xd), 0.3, 42);
    fn::rng_advance(counter, xd);
    fn::sum(yd, {}).backward();
    EXPECT_EQ(yd.detach().To(Device::CPU()).ToVector<float>(), y.detach().ToVector<float>()) << shape;
    EXPECT_EQ(xd.grad().To(Device::CPU()).ToVector<float>(), x.grad().ToVector<float>()) << shape;
    EXPECT_EQ(counter.To(Device::CPU()).ToVector<int64_t>(), std::vector<int64_t>{1000 + shape.numel()});
    const Tensor half = fn::cast(x.detach(), DType::kBFloat16);
    EXPECT_EQ(fn::cast(fn::dropout(half.To(gpu), Counter(7).To(gpu), 0.5, 9), DType::kFloat32)
                  .To(Device::CPU())
                  .ToVector<float>(),
              fn::dropout(fn::cast(half, DType::kFloat32), Counter(7), 0.5, 9).ToVector<float>())
        << shape;
  }
}
#endif

}  // namespace
}  // namespace tessel
