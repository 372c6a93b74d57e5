// Parameters and optimizer states are variables: a step updates them in
// place (same storage, every handle sees the new value, still a leaf that
// requires gradients), and the in-place update ops refuse what would make
// them silently wrong. AdamW's steps equal torch.optim.AdamW's, computed
// when the test runs (torch_adamw.py).
#include "layers/optimizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "graph/autograd.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

// loss = sum(w * w): the gradient is 2w.
void Backward(const Tensor& w) { fn::sum(fn::mul(w, w), {0, 1}).backward(); }

TEST(OptimizerVariables, AdamWAndSgdUpdateParametersInPlace) {
  const Placement one("cpu", {0});
  for (bool adamw : {true, false}) {
    Tensor w = randn({4, 3}, one, NdSbp{B()}, 5);
    w.set_requires_grad(true);
    const Tensor alias = w;  // another handle on the same variable
    const void* storage = w.to_local().raw_data();
    const std::vector<float> before = w.to_local().ToVector<float>();
    optim::NamedParams params = {{"w", &w}};
    optim::AdamW adam(params, {.lr = 0.1, .weight_decay = 0.0});
    optim::SGD sgd(params, 0.1, 0.9);
    for (int step = 0; step < 2; ++step) {
      Backward(w);
      adamw ? adam.Step() : sgd.Step();
    }
    EXPECT_EQ(w.to_local().raw_data(), storage) << (adamw ? "AdamW" : "SGD") << " replaced the parameter";
    EXPECT_EQ(alias.to_local().ToVector<float>(), w.to_local().ToVector<float>());
    EXPECT_NE(w.to_local().ToVector<float>(), before);
    EXPECT_TRUE(w.requires_grad());
    EXPECT_FALSE(w.grad().defined());
    if (!adamw) {
      // SGD with momentum 0.9, gradient 2w: v1 = 2w0, w1 = w0 - 0.1 v1;
      // v2 = 0.9 v1 + 2w1, w2 = w1 - 0.1 v2.
      const std::vector<float> after = w.to_local().ToVector<float>();
      for (size_t i = 0; i < before.size(); ++i) {
        const double w0 = before[i], v1 = 2 * w0, w1 = w0 - 0.1 * v1, v2 = 0.9 * v1 + 2 * w1;
        EXPECT_NEAR(after[i], w1 - 0.1 * v2, 1e-5) << "element " << i;
      }
    }
  }
}

void WriteF32(const std::filesystem::path& path, const std::vector<float>& v) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

std::vector<float> ReadF32(const std::filesystem::path& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
  EXPECT_TRUE(in.good()) << path;
  return v;
}

TEST(OptimizerVariables, AdamWStepsEqualTorchOptimAdamW) {
  // Two parameters (one a vector), five steps with a learning rate that
  // changes after the second, weight decay and betas other than the
  // defaults: tessel's AdamW and torch.optim.AdamW from the same values and
  // gradients. Each step's gradient is set through backward (loss =
  // sum(w * g)), as a training step sets it.
  const Placement one("cpu", {0});
  const std::vector<Shape> shapes = {Shape({5, 3}), Shape({7})};
  const std::vector<double> lrs = {0.01, 0.01, 0.003, 0.003, 0.02};
  const optim::AdamWConfig config{
      .lr = lrs[0], .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_adamw_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<Tensor> ws;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ws.push_back(randn(shapes[i], one, NdSbp{B()}, 40 + i).set_requires_grad(true));
    WriteF32(dir / ("w0_" + std::to_string(i) + ".bin"), ws[i].to_local().ToVector<float>());
  }
  optim::NamedParams params = {{"w", &ws[0]}, {"b", &ws[1]}};
  optim::AdamW adamw(params, config);
  std::vector<std::vector<std::vector<float>>> ours;  // [step][param]
  for (size_t step = 0; step < lrs.size(); ++step) {
    adamw.set_lr(lrs[step]);
    Tensor loss;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = randn(shapes[i], one, NdSbp{B()}, 100 * (step + 1) + i);
      WriteF32(dir / ("g" + std::to_string(step) + "_" + std::to_string(i) + ".bin"),
               g.to_local().ToVector<float>());
      std::vector<int64_t> axes;
      for (int64_t a = 0; a < shapes[i].ndim(); ++a) axes.push_back(a);
      const Tensor term = fn::sum(fn::mul(ws[i], g), axes);
      loss = loss.defined() ? fn::add(loss, term) : term;
    }
    loss.backward();
    adamw.Step();
    ours.emplace_back();
    for (const Tensor& w : ws) ours.back().push_back(w.to_local().ToVector<float>());
  }
  std::ostringstream json;
  json << "{\"shapes\": [[5, 3], [7]], \"lrs\": [";
  for (size_t i = 0; i < lrs.size(); ++i) json << (i ? ", " : "") << lrs[i];
  // The matrix is decayed, the vector not (optim::AdamW's rule for biases
  // and norms).
  json << "], \"decays\": [true, false], \"beta1\": 0.8, \"beta2\": 0.95, \"eps\": 1e-6, "
          "\"weight_decay\": 0.1}";
  std::ofstream(dir / "case.json") << json.str();
  const std::string cmd =
      std::string(TESSEL_TORCH_PYTHON) + " " TESSEL_SOURCE_DIR "/tests/layers/torch_adamw.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  for (size_t step = 0; step < lrs.size(); ++step) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::vector<float>& got = ours[step][i];
      const std::vector<float> want =
          ReadF32(dir / ("torch_w" + std::to_string(step) + "_" + std::to_string(i) + ".bin"), got.size());
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_NEAR(got[k], want[k], 2e-6 * (1 + std::abs(want[k])))
            << "step " << step << " param " << i << " [" << k << "]";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(OptimizerVariables, ParametersSharingMemoryAreRefused) {
  const Placement one("cpu", {0});
  Tensor w = randn({4, 3}, one, NdSbp{B()}, 5);
  Tensor tied = w;  // the same parameter under a second name
  const std::string error = ErrorOf([&] { optim::SGD sgd({{"wte", &w}, {"lm_head", &tied}}, 0.1); });
  EXPECT_NE(error.find("parameters 'wte' and 'lm_head' share memory"), std::string::npos) << error;
}

TEST(OptimizerVariables, InPlaceUpdateRefusesSharedMemory) {
  NoGradGuard no_grad;
  Tensor p = ones({3, 2}), g = ones({3, 2}), m = zeros({3, 2});
  const Tensor step = ReplicatedScalar(0, p, DType::kInt64), lr = ReplicatedScalar(0.1, p, DType::kFloat32);
  const std::string error = ErrorOf([&] { fn::adamw_update(p, g, m, m, step, lr, {}); });
  EXPECT_NE(error.find("'adamw_update' updates its input exp_avg in place, but it shares memory with input "
                       "exp_avg_sq"),
            std::string::npos)
      << error;
  // Nothing was written.
  EXPECT_EQ(p.ToVector<float>(), std::vector<float>(6, 1.0f));
}

TEST(OptimizerVariables, InPlaceUpdateOfATensorThatRequiresGradIsRefusedWhileRecording) {
  Tensor p = ones({3, 2});
  p.set_requires_grad(true);
  const std::string error = ErrorOf([&] {
    fn::sgd_update(p, ones({3, 2}), zeros({3, 2}), 0.1, 0.0, 0.0, true);
  });
  EXPECT_NE(error.find("'sgd_update' updates its input param in place, and that tensor requires gradients"),
            std::string::npos)
      << error;
  EXPECT_EQ(p.ToVector<float>(), std::vector<float>(6, 1.0f));
  // Under NoGradGuard (what the optimizers use) the same call updates p.
  NoGradGuard no_grad;
  fn::sgd_update(p, ones({3, 2}), zeros({3, 2}), 0.1, 0.0, 0.0, true);
  EXPECT_NEAR(p.ToVector<float>()[0], 0.9f, 1e-6);
}

}  // namespace
}  // namespace tessel
