// tessel's layers against PyTorch modules on the same weights, forward and
// backward, computed with PyTorch when the test runs (torch_modules.py):
// Linear, Embedding, LayerNorm, MultiheadAttention (causal and not),
// TransformerEncoderLayer (pre-LN, GELU) and CrossEntropyLoss.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/regularization.h"
#include "layers/transformer.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::RelError;

namespace fs = std::filesystem;

void Write(const fs::path& path, const Tensor& t) {
  Tensor l = t.detach().to_local();
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(l.raw_data()), l.nbytes());
}

Tensor Read(const fs::path& path, const Shape& shape) {
  Tensor t = Tensor::Empty(shape, DType::kFloat32);
  std::ifstream(path, std::ios::binary).read(static_cast<char*>(t.raw_data()), t.nbytes());
  return t;
}

std::string Dims(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < s.ndim(); ++i) os << (i ? "," : "") << s.dims()[i];
  return os.str() + "]";
}

// Gives every parameter well-spread values (init std 0.02 would make
// attention nearly uniform and hide mistakes).
void Randomize(nn::Module& m, uint64_t seed) {
  NoGradGuard no_grad;
  for (auto& [name, p] : m.NamedParameters()) {
    Tensor v = fn::mul_scalar(randn(p->shape(), p->placement(), p->nd_sbp(), seed++), 0.5);
    if (name.find("ln") != std::string::npos && name.find("weight") != std::string::npos)
      v = fn::add_scalar(v, 1.0);
    *p = v.set_requires_grad(true);
  }
}

struct Case {
  std::string name, kind, extra_json;
  nn::Module* module;  // null for the loss
  Tensor x;            // input (f32 or i64 ids)
  std::function<Tensor(const Tensor&)> forward;
  Tensor labels = {};
};

TEST(ModuleParity, LayersMatchTorchModules) {
  dist::Setup({});
  const Placement p = dist::GetLayerPlacement(0);
  layers::Linear linear(7, 5, {.seed = 1});
  layers::VocabEmbedding embedding(11, 6, {.seed = 2});
  layers::LayerNorm norm(6);
  layers::MultiheadAttention attn(8, 2, {.causal = false, .seed = 3});
  layers::MultiheadAttention causal(8, 2, {.causal = true, .seed = 4});
  layers::TransformerLayer block(8, 2, 16, {.causal = false, .seed = 5});
  layers::PatchEmbedding patches(3, 5, 2, 0, 6);
  uint64_t seed = 100;
  for (nn::Module* m : std::vector<nn::Module*>{&linear, &embedding, &norm, &attn, &causal, &block, &patches})
    Randomize(*m, seed += 50);
  Tensor ids = Tensor::FromVector<int64_t>({3, 0, 10, 3, 9, 1, 5, 0}, {2, 4});
  Tensor labels = Tensor::FromVector<int64_t>({1, -100, 4, 0, 2, 6, 3, -100, 5, 1}, {2, 5});
  std::vector<Case> cases = {
      {"linear", "linear", "", &linear, randn({3, 4, 7}, 7), [&](const Tensor& x) { return linear(x); }},
      {"embedding", "embedding", "", &embedding, ids, [&](const Tensor& x) { return embedding(x); }},
      {"layer_norm", "layer_norm", "", &norm, randn({3, 6}, 8), [&](const Tensor& x) { return norm(x); }},
      {"attention", "attention", ", \"heads\": 2, \"causal\": false", &attn, randn({2, 5, 8}, 9),
       [&](const Tensor& x) { return attn(x); }},
      {"attention_causal", "attention", ", \"heads\": 2, \"causal\": true", &causal, randn({2, 5, 8}, 10),
       [&](const Tensor& x) { return causal(x); }},
      {"transformer", "transformer", ", \"heads\": 2", &block, randn({2, 5, 8}, 11),
       [&](const Tensor& x) { return block(x); }},
      {"patch_embedding", "patch_embedding", ", \"patch\": 2", &patches, randn({2, 3, 4, 6}, 13),
       [&](const Tensor& x) { return patches(x); }},
      {"cross_entropy", "cross_entropy", ", \"labels_shape\": [2, 5]", nullptr, randn({2, 5, 7}, 12),
       [&](const Tensor& x) { return layers::ParallelCrossEntropyLoss(x, labels); }, labels},
  };

  fs::path dir = fs::temp_directory_path() / ("tessel_modules_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<Tensor> outs, dys, gxs;
  std::vector<std::vector<std::pair<std::string, Tensor*>>> params;
  std::ostringstream manifest;
  manifest << "[";
  for (size_t c = 0; c < cases.size(); ++c) {
    Case& k = cases[c];
    params.push_back(k.module ? k.module->NamedParameters() : std::vector<std::pair<std::string, Tensor*>>{});
    const bool is_int = k.x.dtype() == DType::kInt64;
    Tensor x = is_int ? k.x : k.x.Clone().set_requires_grad(true);
    Write(dir / (k.name + ".x"), k.x);
    if (k.labels.defined()) Write(dir / (k.name + ".labels"), k.labels);
    manifest << (c ? "," : "") << "{\"name\": \"" << k.name << "\", \"kind\": \"" << k.kind
             << "\", \"x_shape\": " << Dims(k.x.shape()) << ", \"x_int\": " << (is_int ? "true" : "false")
             << ", \"params\": [";
    for (size_t i = 0; i < params[c].size(); ++i)
      manifest << (i ? "," : "") << "\"" << params[c][i].first << "\"";
    manifest << "], \"param_shapes\": [";
    for (size_t i = 0; i < params[c].size(); ++i) {
      manifest << (i ? "," : "") << Dims(params[c][i].second->shape());
      Write(dir / (k.name + ".p" + std::to_string(i)), *params[c][i].second);
    }
    manifest << "]" << k.extra_json << "}";
    Tensor y = k.forward(x);
    Tensor dy = randn(y.shape(), 500 + c);
    Tensor dy_g =
        y.is_global() ? FromLocal(dy, y.placement(), NdSbp(std::vector<Sbp>(y.placement().ndim(), B()))) : dy;
    y.backward(dy_g);
    Write(dir / (k.name + ".dy"), dy);
    outs.push_back(y.detach().is_global() ? GatherLogical(y.detach()) : y.detach());
    gxs.push_back(is_int ? Tensor() : x.grad());
  }
  manifest << "]";
  std::ofstream(dir / "cases.json") << manifest.str();
  std::string cmd = std::string(TESSEL_TORCH_PYTHON) +
                    " " TESSEL_SOURCE_DIR "/tests/layers/torch_modules.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  int compared = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c].name);
    EXPECT_LE(RelError(outs[c], Read(dir / (cases[c].name + ".out"), outs[c].shape())), 1e-5) << "forward";
    if (gxs[c].defined()) {
      Tensor gx = gxs[c].is_global() ? GatherLogical(gxs[c]) : gxs[c];
      EXPECT_LE(RelError(gx, Read(dir / (cases[c].name + ".gx"), gx.shape())), 1e-5) << "input gradient";
    }
    for (size_t i = 0; i < params[c].size(); ++i) {
      Tensor g = GatherLogical(params[c][i].second->grad());
      EXPECT_LE(RelError(g, Read(dir / (cases[c].name + ".g" + std::to_string(i)), g.shape())), 1e-5)
          << params[c][i].first << " gradient";
    }
    ++compared;
  }
  std::printf("module parity vs PyTorch: %d modules, outputs and gradients of inputs and parameters\n",
              compared);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
