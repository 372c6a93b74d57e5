// One forward+backward of a stack of pre-LN transformer blocks (causal
// self-attention + GELU MLP) built from tessel's functional ops, timed as
// the best of --iters runs. torch_transformer_bench.py builds the same stack
// in PyTorch; transformer_vs_torch.py runs both in one invocation.
#include <gflags/gflags.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "graph/autograd.h"
#include "graph/init.h"
#include "ops/functional.h"

DEFINE_int64(layers, 4, "Transformer blocks");
DEFINE_int64(batch, 4, "Sequences per batch");
DEFINE_int64(seq, 128, "Tokens per sequence");
DEFINE_int64(hidden, 256, "Hidden size");
DEFINE_int64(heads, 4, "Attention heads");
DEFINE_int32(iters, 5, "Timed iterations (best is reported)");

using namespace tessel;

namespace {

struct Block {
  Tensor ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_1, b_1, w_2, b_2;
  std::vector<Tensor*> params() {
    return {&ln1_g, &ln1_b, &w_qkv, &b_qkv, &w_o, &b_o, &ln2_g, &ln2_b, &w_1, &b_1, &w_2, &b_2};
  }
};

Tensor Param(const Shape& shape, uint64_t seed, double scale) {
  Tensor t = randn(shape, seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= static_cast<float>(scale);
  return t.set_requires_grad(true), t;
}

Tensor Forward(std::vector<Block>& blocks, Tensor x) {
  const int64_t b = FLAGS_batch, s = FLAGS_seq, h = FLAGS_hidden, nh = FLAGS_heads, hd = h / nh;
  for (Block& k : blocks) {
    Tensor a = fn::layer_norm(x, k.ln1_g, k.ln1_b);
    Tensor qkv = fn::add(fn::matmul(a, k.w_qkv), k.b_qkv);                    // [b, s, 3h]
    qkv = fn::permute(fn::reshape(qkv, {b, s, 3, nh, hd}), {2, 0, 3, 1, 4});  // [3, b, nh, s, hd]
    Tensor q = fn::reshape(fn::slice(qkv, 0, 0, 1), {b, nh, s, hd});
    Tensor kk = fn::reshape(fn::slice(qkv, 0, 1, 2), {b, nh, s, hd});
    Tensor v = fn::reshape(fn::slice(qkv, 0, 2, 3), {b, nh, s, hd});
    Tensor probs =
        fn::scale_mask_softmax(fn::matmul(q, kk, false, true), Tensor(), 1.0 / std::sqrt(double(hd)), true);
    Tensor ctx = fn::reshape(fn::permute(fn::matmul(probs, v), {0, 2, 1, 3}), {b, s, h});
    x = fn::add(x, fn::add(fn::matmul(ctx, k.w_o), k.b_o));
    Tensor m = fn::gelu(fn::add(fn::matmul(fn::layer_norm(x, k.ln2_g, k.ln2_b), k.w_1), k.b_1));
    x = fn::add(x, fn::add(fn::matmul(m, k.w_2), k.b_2));
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);  // flags, and the eager interpreter the ops run on
  const int64_t h = FLAGS_hidden;
  std::vector<Block> blocks(FLAGS_layers);
  uint64_t seed = 1;
  for (Block& k : blocks) {
    k.ln1_g = Param({h}, seed++, 0.0), k.ln1_b = Param({h}, seed++, 0.0);
    k.ln2_g = Param({h}, seed++, 0.0), k.ln2_b = Param({h}, seed++, 0.0);
    for (Tensor* g : {&k.ln1_g, &k.ln2_g}) *g = fn::add_scalar(g->detach(), 1.0).set_requires_grad(true);
    k.w_qkv = Param({h, 3 * h}, seed++, 0.02), k.b_qkv = Param({3 * h}, seed++, 0.0);
    k.w_o = Param({h, h}, seed++, 0.02), k.b_o = Param({h}, seed++, 0.0);
    k.w_1 = Param({h, 4 * h}, seed++, 0.02), k.b_1 = Param({4 * h}, seed++, 0.0);
    k.w_2 = Param({4 * h, h}, seed++, 0.02), k.b_2 = Param({h}, seed++, 0.0);
  }
  Tensor x = randn({FLAGS_batch, FLAGS_seq, h}, 999);
  double best = 1e30, loss = 0;
  for (int it = 0; it < FLAGS_iters + 1; ++it) {  // the first run warms up
    for (Block& k : blocks)
      for (Tensor* p : k.params()) p->zero_grad();
    auto t0 = std::chrono::steady_clock::now();
    Tensor y = fn::mean(Forward(blocks, x), {});
    y.backward();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    loss = y.detach().data<float>()[0];
    if (it > 0) best = std::min(best, secs);
  }
  std::printf("{\"impl\": \"tessel\", \"ms\": %.2f, \"loss\": %.6f}\n", best * 1e3, loss);
  return 0;
}
