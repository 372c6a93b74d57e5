// The multi-tensor kernels of the optimizer step (ops/cuda/multi_tensor.h)
// against the ops they stand in for, on tensors of sizes that cross the
// kernels' 65,536-element chunks: widening and unscaling equal cast and
// mul_scalar bit for bit, the norm equals global_norm's to rounding,
// narrowing (and clipping) equals cast (of mul_scalar) bit for bit, and
// the AdamW step equals adamw_update's per parameter bit for bit, step
// counts included. "skipped: no CUDA device" without a GPU
// (TESSEL_REQUIRE_GPU=1 fails instead).
#include "ops/cuda/multi_tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/cuda/cuda_runtime.h"
#include "graph/autograd.h"
#include "ops/functional.h"
#include "tests/testing/gpu.h"

namespace tessel {
namespace {

std::vector<Tensor> Grads(DType dtype) {
  std::vector<Tensor> out;
  uint64_t seed = 7;
  for (const Shape& s : {Shape{3}, Shape{1000, 257}, Shape{65536}, Shape{65537}, Shape{5, 7}})
    out.push_back(fn::cast(randn(s, seed++), dtype).To(Device::CUDA(0)));
  return out;
}

TEST(MultiTensor, UnscaleAndNormMatchCastScaleAndGlobalNorm) {
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
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
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
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

TEST(MultiTensor, ScaledCastIntoInPlaceMatchesMulScalar) {
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  NoGradGuard no_grad;
  const std::vector<Tensor> grads = Grads(DType::kFloat32);
  std::vector<Tensor> want, inplace;
  for (const Tensor& g : grads) {
    want.push_back(fn::mul_scalar(g, 0.3183));
    inplace.push_back(fn::mul_scalar(g, 1.0));  // a copy to clip in place
  }
  cuda::CastInto(inplace, inplace, 0.3183);
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_EQ(inplace[i].To(Device::CPU()).ToVector<float>(), want[i].To(Device::CPU()).ToVector<float>())
        << i;
}

TEST(MultiTensor, AdamWStepMatchesAdamWUpdateOfEachParameter) {
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
  NoGradGuard no_grad;
  const std::vector<Tensor> start = Grads(DType::kFloat32);
  const Device gpu = Device::CUDA(0);
  // Two copies of every parameter and its state: one for the op, one for
  // the multi-tensor step. Odd parameters decay, even ones do not.
  struct State {
    std::vector<Tensor> params, exp_avgs, exp_avg_sqs, steps;
  } op, multi;
  for (State* s : {&op, &multi}) {
    for (const Tensor& p : start) {
      s->params.push_back(fn::mul_scalar(p, 1.0));
      s->exp_avgs.push_back(zeros(p.shape(), DType::kFloat32, gpu));
      s->exp_avg_sqs.push_back(zeros(p.shape(), DType::kFloat32, gpu));
      s->steps.push_back(zeros(Shape(std::vector<int64_t>{}), DType::kInt64, gpu));
    }
  }
  const Tensor lr = Tensor::FromVector<float>({3e-3f}, Shape(std::vector<int64_t>{})).To(gpu);
  uint64_t seed = 100;
  for (int step = 0; step < 3; ++step) {
    cuda::AdamWGroup group{multi.params, {}, multi.exp_avgs, multi.exp_avg_sqs, multi.steps, {}};
    for (size_t i = 0; i < start.size(); ++i) {
      const Tensor g = randn(start[i].shape(), seed++).To(gpu);
      const double wd = i % 2 == 1 ? 0.1 : 0.0;
      fn::adamw_update(op.params[i], g, op.exp_avgs[i], op.exp_avg_sqs[i], op.steps[i], lr,
                       {0.9, 0.95, 1e-8, wd});
      group.grads.push_back(g);
      group.weight_decays.push_back(wd);
    }
    cuda::AdamWStep(group, lr, 0.9, 0.95, 1e-8);
  }
  for (size_t i = 0; i < start.size(); ++i) {
    SCOPED_TRACE(start[i].shape().ToString());
    EXPECT_EQ(multi.params[i].To(Device::CPU()).ToVector<float>(),
              op.params[i].To(Device::CPU()).ToVector<float>());
    EXPECT_EQ(multi.exp_avgs[i].To(Device::CPU()).ToVector<float>(),
              op.exp_avgs[i].To(Device::CPU()).ToVector<float>());
    EXPECT_EQ(multi.exp_avg_sqs[i].To(Device::CPU()).ToVector<float>(),
              op.exp_avg_sqs[i].To(Device::CPU()).ToVector<float>());
    EXPECT_EQ(multi.steps[i].To(Device::CPU()).ToVector<int64_t>(), std::vector<int64_t>{3});
  }
}

TEST(MultiTensor, MismatchedPairsAreNamed) {
  if (testing::NoGpu()) GTEST_SKIP() << "skipped: no CUDA device";
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
