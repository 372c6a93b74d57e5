#include "layers/plain.h"

#include <cmath>

#include "core/error.h"
#include "graph/autograd.h"
#include "ops/functional.h"

namespace tessel::layers::plain {

namespace {
Tensor Normal(const Shape& shape, uint64_t seed, double std) {
  NoGradGuard no_grad;
  return fn::mul_scalar(randn(shape, seed), std);
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, uint64_t seed, double init_std, bool with_bias)
    : in_(in_features), out_(out_features) {
  weight = Normal({in_, out_}, seed, init_std);
  RegisterParameter("weight", weight);
  if (with_bias) {
    bias = zeros({out_});
    RegisterParameter("bias", bias);
  }
}

Tensor Linear::operator()(const Tensor& x) const {
  TESSEL_CHECK(x.ndim() >= 1 && x.shape()[-1] == in_)
      << "Linear(" << in_ << " -> " << out_ << "): input of shape " << x.shape() << " has "
      << (x.ndim() >= 1 ? x.shape()[-1] : 0) << " features; expected " << in_;
  const Tensor y = fn::matmul(x, weight);
  return bias.defined() ? fn::add(y, bias) : y;
}

LayerNorm::LayerNorm(int64_t hidden, double eps) : eps_(eps) {
  weight = ones({hidden});
  bias = zeros({hidden});
  RegisterParameter("weight", weight);
  RegisterParameter("bias", bias);
}

Tensor LayerNorm::operator()(const Tensor& x) const { return fn::layer_norm(x, weight, bias, eps_); }

Embedding::Embedding(int64_t num_embeddings, int64_t hidden, uint64_t seed, double init_std) {
  weight = Normal({num_embeddings, hidden}, seed, init_std);
  RegisterParameter("weight", weight);
}

Tensor Embedding::operator()(const Tensor& ids) const { return fn::embedding(weight, ids); }

SelfAttention::SelfAttention(int64_t hidden, int64_t heads, bool causal, uint64_t seed, double init_std)
    : hidden_(hidden),
      heads_(heads),
      causal_(causal),
      query_(hidden, hidden, seed, init_std),
      key_(hidden, hidden, seed + 1, init_std),
      value_(hidden, hidden, seed + 2, init_std),
      out_(hidden, hidden, seed + 3, init_std) {
  TESSEL_CHECK(heads > 0 && hidden % heads == 0)
      << "SelfAttention: hidden=" << hidden << " is not divisible by heads=" << heads;
  RegisterModule("query", query_);
  RegisterModule("key", key_);
  RegisterModule("value", value_);
  RegisterModule("out", out_);
}

Tensor SelfAttention::operator()(const Tensor& x) const {
  TESSEL_CHECK(x.ndim() == 3) << "SelfAttention: input of shape " << x.shape()
                              << "; expected [batch, seq, hidden]";
  const int64_t b = x.shape()[0], s = x.shape()[1], hd = hidden_ / heads_;
  // [b, s, hidden] -> [b, heads, s, hd]
  auto heads = [&](const Tensor& t) { return fn::permute(fn::reshape(t, {b, s, heads_, hd}), {0, 2, 1, 3}); };
  const Tensor q = heads(query_(x)), k = heads(key_(x)), v = heads(value_(x));
  const Tensor probs = fn::scale_mask_softmax(fn::matmul(q, k, false, true), Tensor(),
                                              1.0 / std::sqrt(static_cast<double>(hd)), causal_);
  const Tensor ctx = fn::permute(fn::matmul(probs, v), {0, 2, 1, 3});  // [b, s, heads, hd]
  return out_(fn::reshape(ctx, {b, s, hidden_}));
}

Mlp::Mlp(int64_t hidden, int64_t ffn_hidden, uint64_t seed, double init_std)
    : fc1_(hidden, ffn_hidden, seed, init_std), fc2_(ffn_hidden, hidden, seed + 1, init_std) {
  RegisterModule("fc1", fc1_);
  RegisterModule("fc2", fc2_);
}

Tensor Mlp::operator()(const Tensor& x) const { return fc2_(fn::gelu(fc1_(x))); }

Block::Block(int64_t hidden, int64_t heads, int64_t ffn_hidden, bool causal, uint64_t seed, double eps,
             double init_std)
    : ln1_(hidden, eps),
      ln2_(hidden, eps),
      attention_(hidden, heads, causal, seed, init_std),
      mlp_(hidden, ffn_hidden, seed + 10, init_std) {
  RegisterModule("ln1", ln1_);
  RegisterModule("attention", attention_);
  RegisterModule("ln2", ln2_);
  RegisterModule("mlp", mlp_);
}

Tensor Block::operator()(const Tensor& x) const {
  const Tensor h = fn::add(x, attention_(ln1_(x)));
  return fn::add(h, mlp_(ln2_(h)));
}

}  // namespace tessel::layers::plain
