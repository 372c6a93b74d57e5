// The multi-tensor kernels of the mixed-precision step (ops/cuda/multi_tensor.h)
// against the ops they stand in for, on tensors of sizes that cross the
// kernels' 65,536-element chunks: widening and unscaling equal cast and
// mul_scalar bit for bit, the norm equals global_norm's to rounding, and
// narrowing equals cast bit for bit. "skipped: no CUDA device" without a GPU
// (TESSEL_REQUIRE_GPU=1 fails instead).
#include "ops/cuda/multi_tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/cuda/cuda_runtime.h"
#include "graph/autograd.h"
#include "ops/functional.h"

namespace tessel {
namespace {

bool NoGpu() {
  if (cuda::DeviceCount() > 0) return false;
  const char* required = std::getenv("TESSEL_REQUIRE_GPU");
  if (required != nullptr && std::string(required) == "1") ADD_FAILURE() << "TESSEL_REQUIRE_GPU=1 but no GPU";
  return true;
}

std::vector<Tensor> Grads(DType dtype) {
  std::vector<Tensor> out;
  uint64_t seed = 7;
  for (const Shape& s : {Shape{3}, Shape{1000, 257}, Shape{65536}, Shape{65537}, Shape{5, 7}})
    out.push_back(fn::cast(randn(s, seed++), dtype).To(Device::CUDA(0)));
  return out;
}

TEST(MultiTensor, UnscaleAndNormMatchCastScaleAndGlobalNorm) {
  if (NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  NoGradGuard no_grad;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const std::vector<Tensor> low = Grads(dtype);
    std::vector<Tensor> wide, want;
    for (const Tensor& g : low) {
      wide.push_back(Tensor::Empty(g.shape(), DType::kFloat32, g.device()));
      want.push_back(fn::mul_scalar(fn::cast(g, DType::kFloat32), 1.0 / 1024));
    }
    const Tensor norm = cuda::UnscaleAndNorm(low, wide, 1.0 / 1024);
    for (size_t i = 0; i < low.size(); ++i)
      EXPECT_EQ(wide[i].To(Device::CPU()).ToVector<float>(), want[i].To(Device::CPU()).ToVector<float>())
          << i;
    const double got = norm.To(Device::CPU()).ToVector<float>()[0];
    const double ref = fn::global_norm(want).To(Device::CPU()).ToVector<float>()[0];
    EXPECT_NEAR(got, ref, 1e-6 * ref);
  }
}

TEST(MultiTensor, CastIntoMatchesCast) {
  if (NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  NoGradGuard no_grad;
  const std::vector<Tensor> masters = Grads(DType::kFloat32);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    std::vector<Tensor> model;
    for (const Tensor& m : masters) model.push_back(Tensor::Empty(m.shape(), dtype, m.device()));
    cuda::CastInto(masters, model);
    for (size_t i = 0; i < masters.size(); ++i) {
      const Tensor want = fn::cast(fn::cast(masters[i], dtype), DType::kFloat32).To(Device::CPU());
      EXPECT_EQ(fn::cast(model[i], DType::kFloat32).To(Device::CPU()).ToVector<float>(),
                want.ToVector<float>())
          << i;
    }
  }
}

TEST(MultiTensor, MismatchedPairsAreNamed) {
  if (NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  const Tensor a = zeros({4}, DType::kFloat32, Device::CUDA(0)),
               b = zeros({5}, DType::kFloat32, Device::CUDA(0));
  try {
    cuda::CastInto({a}, {b});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pair 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessel
