// CUDA backend checks; each skips when no GPU is visible (this build host).
#include <gtest/gtest.h>

#include "core/cuda/cuda_runtime.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tessel {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible"

TEST(Cuda, TensorRoundTripThroughDevice) {
  SKIP_WITHOUT_GPU();
  Tensor host = arange({7, 5, 3});
  Tensor dev = host.To(Device::CUDA(0));
  EXPECT_EQ(dev.device(), Device::CUDA(0));
  EXPECT_EQ(dev.To(Device::CPU()).ToVector<float>(), host.ToVector<float>());
}

TEST(Cuda, PhiloxMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 10007;
  Tensor dev = Tensor::Empty({n}, DType::kFloat32, Device::CUDA(0));
  cuda::PhiloxUniform(static_cast<float*>(dev.raw_data()), n, 42, 3, 0);
  Tensor cpu = rand({n}, 42, 3);
  EXPECT_EQ(dev.To(Device::CPU()).ToVector<float>(), cpu.ToVector<float>());
}

TEST(Cuda, MissingDeviceIsAClearError) {
  int count = cuda::DeviceCount();
  try {
    Tensor::Empty({4}, DType::kFloat32, Device::CUDA(count));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device cuda:" + std::to_string(count) + " requested"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tessel
