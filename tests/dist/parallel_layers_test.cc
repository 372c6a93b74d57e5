// Parallel layers match the single-rank computation: a column-parallel
// Linear, GELU, a row-parallel Linear (Megatron's MLP) and a data-parallel
// Linear, under the --dp/--tp layout, compared with the same logical
// weights applied to local tensors: outputs, weight, bias and input
// gradients, within 1e-5.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/comm/process_group.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/embedding.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

DEFINE_int64(dp, 1, "data parallel size");
DEFINE_int64(tp, 2, "tensor parallel size");

namespace tessel {
namespace {

using testing::RelError;

Tensor Local(const Tensor& global) { return GatherLogical(global).detach(); }

TEST(ParallelLayers, MlpAndDataParallelLinearMatchOneRank) {
  dist::Setup({.data_parallel_size = FLAGS_dp, .tensor_parallel_size = FLAGS_tp});
  const int64_t batch = 7, in = 6, hidden = 12, out = 5;  // odd batch: uneven data-parallel split
  layers::Linear fc1(in, hidden, {.parallel = layers::Parallel::kCol, .seed = 1});
  layers::Linear fc2(hidden, out, {.parallel = layers::Parallel::kRow, .seed = 2});
  layers::Linear head(out, 3, {.parallel = layers::Parallel::kData, .seed = 3});
  // Non-zero biases so their gradients and additions are exercised.
  for (layers::Linear* l : {&fc1, &fc2, &head}) {
    NoGradGuard no_grad;
    l->bias = fn::add_scalar(fn::mul_scalar(l->bias, 0.0), 0.1).set_requires_grad(true);
  }
  const Placement p = dist::GetLayerPlacement(0);
  Tensor x = randn({batch, in}, p, dist::GetHiddenSbp(), 42).set_requires_grad(true);
  Tensor r = randn({batch, 3}, p, dist::GetHiddenSbp(), 43);
  Tensor y = head(fc2(fn::gelu(fc1(x))));
  EXPECT_EQ(y.nd_sbp(), dist::GetHiddenSbp());
  fn::sum(fn::mul(y, r), {}).backward();

  // The same logical computation on one rank, with local tensors.
  std::vector<Tensor> w;
  for (layers::Linear* l : {&fc1, &fc2, &head}) {
    w.push_back(Local(l->weight).set_requires_grad(true));
    w.push_back(Local(l->bias).set_requires_grad(true));
  }
  Tensor lx = Local(x).set_requires_grad(true);
  Tensor h = fn::gelu(fn::add(fn::matmul(lx, w[0]), w[1]));
  h = fn::add(fn::matmul(h, w[2]), w[3]);
  Tensor ly = fn::add(fn::matmul(h, w[4]), w[5]);
  fn::sum(fn::mul(ly, Local(r)), {}).backward();

  EXPECT_LE(RelError(Local(y), ly.detach()), 1e-5) << "output";
  EXPECT_LE(RelError(Local(x.grad()), lx.grad()), 1e-5) << "input gradient";
  const char* names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight", "head.bias"};
  std::vector<Tensor*> params = {&fc1.weight, &fc1.bias, &fc2.weight, &fc2.bias, &head.weight, &head.bias};
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i]->grad().defined()) << names[i];
    EXPECT_LE(RelError(Local(params[i]->grad()), w[i].grad()), 1e-5) << names[i] << " gradient";
  }
  if (comm::World().rank() == 0) {
    std::printf("parallel layers match one rank under dp=%ld tp=%ld (fc1.weight %s, its gradient %s)\n",
                static_cast<long>(FLAGS_dp), static_cast<long>(FLAGS_tp),
                fc1.weight.nd_sbp().ToString().c_str(), fc1.weight.grad().nd_sbp().ToString().c_str());
  }
}

TEST(ParallelLayers, BadSizesAreNamed) {
  dist::Setup({.data_parallel_size = FLAGS_dp, .tensor_parallel_size = FLAGS_tp});
  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of([] { layers::Linear(8, 7, {.parallel = layers::Parallel::kCol}); });
  EXPECT_NE(e.find("out_features=7 is not divisible by tensor_parallel_size=" + std::to_string(FLAGS_tp)),
            std::string::npos)
      << e;
  e = error_of([] { layers::MultiheadAttention(10, 3); });
  EXPECT_NE(e.find("hidden=10 is not divisible by heads=3"), std::string::npos) << e;
  e = error_of([] { layers::MultiheadAttention(4 * (FLAGS_tp + 1), FLAGS_tp + 1); });
  if (FLAGS_tp > 1) {
    EXPECT_NE(e.find("is not divisible by tensor_parallel_size"), std::string::npos) << e;
  }
  e = error_of([] { layers::VocabEmbedding(1001, 8); });
  EXPECT_NE(e.find("vocab_size=1001 is not divisible by tensor_parallel_size=" + std::to_string(FLAGS_tp)),
            std::string::npos)
      << e;
  e = error_of([] { dist::Setup({.data_parallel_size = 3, .tensor_parallel_size = FLAGS_tp}); });
  EXPECT_NE(e.find("data_parallel_size=3 disagrees with world"), std::string::npos) << e;
  e = error_of([] { dist::Setup({.tensor_parallel_size = 3}); });
  EXPECT_NE(e.find("does not divide the world size"), std::string::npos) << e;
  dist::Setup({.data_parallel_size = FLAGS_dp, .tensor_parallel_size = FLAGS_tp});
  e = error_of([] { dist::GetLayerPlacement(5); });
  EXPECT_NE(e.find("layer_idx 5 is out of range"), std::string::npos) << e;
}

}  // namespace
}  // namespace tessel
