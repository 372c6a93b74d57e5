#include "checkpoint/hugging_face.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/box_copy.h"
#include "core/error.h"
#include "core/half.h"
#include "zoo/safetensors.h"

namespace tessel::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;

// How a tessel parameter is laid out in Hugging Face's file(s).
enum class Layout {
  kSame,         // the same elements in the same order (possibly another shape: [1, 1, h] for [h])
  kTranspose,    // nn.Linear [out, in] for tessel's [in, out]
  kFusedQkv,     // GPT-2's c_attn: [q|k|v][head][head dim] columns for tessel's [head][q|k|v][head dim]
  kSeparateQkv,  // three nn.Linear (query, key, value) for tessel's fused head-major QKV
  kPatchConv,    // Conv2d [hidden, C, p, p] for tessel's Linear [C p p, hidden]
  // Llama's q_proj, k_proj, v_proj (nn.Linear) for tessel's fused [in][key/
  // value group][its query heads | k | v][head dim]; T5's q, k, v alike (a
  // group per head), and with two names, T5's cross-attention k, v for
  // tessel's [in][head][k | v][head dim]
  kGroupedQkv,
  // Llama's gate_proj, up_proj (nn.Linear) for tessel's [in][ffn][gate | up];
  // T5's wi_0, wi_1 alike
  kInterleavedPair,
};

struct Rule {
  std::string tessel;
  std::vector<std::string> hf;  // three for kSeparateQkv
  Layout layout;
  std::vector<int64_t> tessel_shape;            // rows of a vocabulary unpadded
  std::vector<std::vector<int64_t>> hf_shapes;  // one per name in `hf`
  bool vocabulary_rows = false;                 // padded in tessel's memory: cut to vocab_size on export
  std::vector<std::string> aliases = {};        // a tied copy the file may hold instead (import)
};

// "<prefix><i>." (built by appending: GCC 12 warns falsely on "h" + to_string(i)).
std::string Numbered(const std::string& prefix, int64_t i) {
  std::string name = prefix;
  name.append(std::to_string(i)).append(".");
  return name;
}

std::vector<Rule> Rules(const config::ModelConfig& m) {
  const int64_t h = m.hidden_size(), layers = m.hidden_layers();
  const int64_t ffn = m.ffn_hidden_size() > 0 ? m.ffn_hidden_size() : 4 * h;
  const int64_t positions =
      m.max_position_embeddings() > 0 ? m.max_position_embeddings() : m.max_seq_length();
  std::vector<Rule> rules;
  auto same = [&](std::string t, std::string hf, std::vector<int64_t> shape) {
    rules.push_back({std::move(t), {std::move(hf)}, Layout::kSame, shape, {shape}});
  };
  auto linear = [&](const std::string& t, const std::string& hf, int64_t in, int64_t out, bool transposed) {
    rules.push_back({t + ".weight",
                     {hf + ".weight"},
                     transposed ? Layout::kTranspose : Layout::kSame,
                     {in, out},
                     {transposed ? std::vector<int64_t>{out, in} : std::vector<int64_t>{in, out}}});
    same(t + ".bias", hf + ".bias", {out});
  };
  auto norm = [&](const std::string& t, const std::string& hf) {
    same(t + ".weight", hf + ".weight", {h});
    same(t + ".bias", hf + ".bias", {h});
  };
  // A vocabulary table [vocab, hidden], as tessel keeps it too (its padded
  // rows cut on export).
  auto table = [&](std::string t, std::string hf, std::vector<std::string> aliases = {}) {
    rules.push_back({std::move(t),
                     {std::move(hf)},
                     Layout::kSame,
                     {m.vocab_size(), h},
                     {{m.vocab_size(), h}},
                     true,
                     std::move(aliases)});
  };
  // An nn.Linear weight without a bias.
  auto weight = [&](const std::string& t, const std::string& hf, int64_t in, int64_t out) {
    rules.push_back({t + ".weight", {hf + ".weight"}, Layout::kTranspose, {in, out}, {{out, in}}});
  };
  auto names = [](const std::string& prefix, std::initializer_list<const char*> parts) {
    std::vector<std::string> out;
    for (const char* part : parts) out.push_back(prefix + part + ".weight");
    return out;
  };
  auto separate_qkv = [&](const std::string& t, const std::string& hf) {
    std::vector<std::string> w, b;
    for (const char* part : {"query", "key", "value"}) {
      w.push_back(hf + "." + part + ".weight");
      b.push_back(hf + "." + part + ".bias");
    }
    rules.push_back({t + ".weight", w, Layout::kSeparateQkv, {h, 3 * h}, {{h, h}, {h, h}, {h, h}}});
    rules.push_back({t + ".bias", b, Layout::kSeparateQkv, {3 * h}, {{h}, {h}, {h}}});
  };
  if (m.arch() == "gpt2" || m.arch() == "gpt") {
    const std::string base = "transformer.";
    table("wte.weight", base + "wte.weight");
    same("wpe.weight", base + "wpe.weight", {positions, h});
    for (int64_t i = 0; i < layers; ++i) {
      const std::string t = Numbered("h", i), hf = Numbered(base + "h.", i);
      norm(t + "ln1", hf + "ln_1");
      rules.push_back({t + "attention.qkv.weight",
                       {hf + "attn.c_attn.weight"},
                       Layout::kFusedQkv,
                       {h, 3 * h},
                       {{h, 3 * h}}});
      rules.push_back(
          {t + "attention.qkv.bias", {hf + "attn.c_attn.bias"}, Layout::kFusedQkv, {3 * h}, {{3 * h}}});
      linear(t + "attention.out", hf + "attn.c_proj", h, h, false);  // Conv1D: [in, out] as tessel
      norm(t + "ln2", hf + "ln_2");
      linear(t + "mlp.fc1", hf + "mlp.c_fc", h, ffn, false);
      linear(t + "mlp.fc2", hf + "mlp.c_proj", ffn, h, false);
    }
    norm("ln_f", base + "ln_f");
  } else if (m.arch() == "llama") {
    // nn.Linear weights without biases; RMSNorm weights; the output table
    // [vocab, hidden] as tessel keeps it.
    const int64_t kv = h / m.num_attention_heads() *
                       (m.num_key_value_heads() > 0 ? m.num_key_value_heads() : m.num_attention_heads());
    table("embed_tokens.weight", "model.embed_tokens.weight");
    for (int64_t i = 0; i < layers; ++i) {
      const std::string t = Numbered("layers", i), hf = Numbered("model.layers.", i);
      same(t + "input_layernorm.weight", hf + "input_layernorm.weight", {h});
      rules.push_back({t + "self_attn.qkv_proj.weight",
                       names(hf + "self_attn.", {"q_proj", "k_proj", "v_proj"}),
                       Layout::kGroupedQkv,
                       {h, h + 2 * kv},
                       {{h, h}, {kv, h}, {kv, h}}});
      weight(t + "self_attn.o_proj", hf + "self_attn.o_proj", h, h);
      same(t + "post_attention_layernorm.weight", hf + "post_attention_layernorm.weight", {h});
      rules.push_back({t + "mlp.gate_up_proj.weight",
                       names(hf + "mlp.", {"gate_proj", "up_proj"}),
                       Layout::kInterleavedPair,
                       {h, 2 * ffn},
                       {{ffn, h}, {ffn, h}}});
      weight(t + "mlp.down_proj", hf + "mlp.down_proj", ffn, h);
    }
    same("norm.weight", "model.norm.weight", {h});
    if (!m.tie_word_embeddings()) table("lm_head.weight", "lm_head.weight");
  } else if (m.arch() == "t5") {
    // T5ForConditionalGeneration: nn.Linear weights without biases, T5's
    // layer norms (weights only), one relative-position table per stack in
    // its first block, the stacks' embed_tokens tied to `shared`.
    const int64_t heads = m.num_attention_heads();
    const int64_t inner = heads * (m.head_dim() > 0 ? m.head_dim() : h / heads);
    table("shared.weight", "shared.weight", {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"});
    for (const bool decoder : {false, true}) {
      const std::string stack = decoder ? "decoder" : "encoder";
      const int64_t count = decoder ? (m.num_decoder_layers() > 0 ? m.num_decoder_layers() : layers) : layers;
      for (int64_t i = 0; i < count; ++i) {
        const std::string t = Numbered(stack, i), hf = Numbered(stack + ".block.", i) + "layer.";
        same(t + "self_norm.weight", hf + "0.layer_norm.weight", {h});
        rules.push_back({t + "self_attention.qkv.weight",
                         names(hf + "0.SelfAttention.", {"q", "k", "v"}),
                         Layout::kGroupedQkv,
                         {h, 3 * inner},
                         {{inner, h}, {inner, h}, {inner, h}}});
        weight(t + "self_attention.o", hf + "0.SelfAttention.o", inner, h);
        if (i == 0)
          same(t + "self_attention.relative_attention_bias",
               hf + "0.SelfAttention.relative_attention_bias.weight",
               {m.relative_attention_num_buckets(), heads});
        std::string ff = hf + "1.";
        if (decoder) {
          same(t + "cross_norm.weight", hf + "1.layer_norm.weight", {h});
          weight(t + "cross_attention.q", hf + "1.EncDecAttention.q", h, inner);
          rules.push_back({t + "cross_attention.kv.weight",
                           names(hf + "1.EncDecAttention.", {"k", "v"}),
                           Layout::kGroupedQkv,
                           {h, 2 * inner},
                           {{inner, h}, {inner, h}}});
          weight(t + "cross_attention.o", hf + "1.EncDecAttention.o", inner, h);
          ff = hf + "2.";
        }
        same(t + "ff_norm.weight", ff + "layer_norm.weight", {h});
        if (m.hidden_act() == "relu") {
          weight(t + "ff.wi", ff + "DenseReluDense.wi", h, ffn);
        } else {
          rules.push_back({t + "ff.wi.weight",
                           names(ff + "DenseReluDense.", {"wi_0", "wi_1"}),
                           Layout::kInterleavedPair,
                           {h, 2 * ffn},
                           {{ffn, h}, {ffn, h}}});
        }
        weight(t + "ff.wo", ff + "DenseReluDense.wo", ffn, h);
      }
      same(stack + "_norm.weight", stack + ".final_layer_norm.weight", {h});
    }
    if (!m.tie_word_embeddings()) table("lm_head.weight", "lm_head.weight");
  } else if (m.arch() == "bert") {
    const std::string e = "bert.embeddings.";
    table("word_embeddings.weight", e + "word_embeddings.weight");
    same("position_embeddings.weight", e + "position_embeddings.weight", {positions, h});
    same("token_type_embeddings.weight", e + "token_type_embeddings.weight", {m.type_vocab_size(), h});
    norm("embedding_ln", e + "LayerNorm");
    for (int64_t i = 0; i < layers; ++i) {
      const std::string t = Numbered("h", i), hf = Numbered("bert.encoder.layer.", i);
      separate_qkv(t + "attention.qkv", hf + "attention.self");
      linear(t + "attention.out", hf + "attention.output.dense", h, h, true);
      norm(t + "ln1", hf + "attention.output.LayerNorm");  // post-LN: after the attention's residual add
      linear(t + "mlp.fc1", hf + "intermediate.dense", h, ffn, true);
      linear(t + "mlp.fc2", hf + "output.dense", ffn, h, true);
      norm(t + "ln2", hf + "output.LayerNorm");
    }
    linear("pooler", "bert.pooler.dense", h, h, true);
    linear("mlm_transform", "cls.predictions.transform.dense", h, h, true);
    norm("mlm_ln", "cls.predictions.transform.LayerNorm");
    rules.push_back({"mlm_bias",
                     {"cls.predictions.bias"},
                     Layout::kSame,
                     {m.vocab_size()},
                     {{m.vocab_size()}},
                     true,
                     {"cls.predictions.decoder.bias"}});
    linear("sentence_head", "cls.seq_relationship", h, 2, true);
  } else if (m.arch() == "vit") {
    const int64_t c = m.num_channels(), p = m.patch_size();
    const int64_t tokens = (m.image_size() / p) * (m.image_size() / p) + 1;
    const std::string e = "vit.embeddings.";
    rules.push_back({"cls_token", {e + "cls_token"}, Layout::kSame, {h}, {{1, 1, h}}});
    rules.push_back(
        {"position_embeddings", {e + "position_embeddings"}, Layout::kSame, {tokens, h}, {{1, tokens, h}}});
    rules.push_back({"patch_embedding.proj.weight",
                     {e + "patch_embeddings.projection.weight"},
                     Layout::kPatchConv,
                     {c * p * p, h},
                     {{h, c, p, p}}});
    same("patch_embedding.proj.bias", e + "patch_embeddings.projection.bias", {h});
    for (int64_t i = 0; i < layers; ++i) {
      const std::string t = Numbered("h", i), hf = Numbered("vit.encoder.layer.", i);
      norm(t + "ln1", hf + "layernorm_before");
      separate_qkv(t + "attention.qkv", hf + "attention.attention");
      linear(t + "attention.out", hf + "attention.output.dense", h, h, true);
      norm(t + "ln2", hf + "layernorm_after");
      linear(t + "mlp.fc1", hf + "intermediate.dense", h, ffn, true);
      linear(t + "mlp.fc2", hf + "output.dense", ffn, h, true);
    }
    norm("ln_f", "vit.layernorm");
    linear("head", "classifier", h, m.num_classes(), true);
  } else {
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "Hugging Face mapping: model.arch '" << m.arch()
        << "' has none; expected gpt2, llama, t5, bert or vit (the zoo's; a model a program registered is "
           "written whole with tessel-checkpoint merge, a safetensors file under its own names)";
  }
  return rules;
}

std::string ShapeText(const std::vector<int64_t>& dims) { return Shape(dims).ToString(); }

// `t`'s elements viewed as `dims`, with the dimensions reordered: result
// dimension i is `dims[perm[i]]`.
Tensor Permuted(const Tensor& t, const std::vector<int64_t>& dims, const std::vector<int>& perm) {
  const int n = static_cast<int>(dims.size());
  const size_t element = ElementSize(t.dtype());
  std::vector<int64_t> stride(n, 1), out_dims(n);
  for (int d = n - 2; d >= 0; --d) stride[d] = stride[d + 1] * dims[d + 1];
  for (int i = 0; i < n; ++i) out_dims[i] = dims[perm[i]];
  Tensor out = Tensor::Empty(Shape(out_dims), t.dtype());
  const auto* src = static_cast<const uint8_t*>(t.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  // Runs along the last dimension when it stays last; element by element otherwise.
  const bool last_kept = n > 0 && perm[n - 1] == n - 1;
  const int outer = last_kept ? n - 1 : n;
  const size_t run = last_kept ? static_cast<size_t>(dims[n - 1]) * element : element;
  std::vector<int64_t> index(outer, 0);
  if (out.numel() == 0) return out;
  for (size_t written = 0;; written += run) {
    int64_t from = 0;
    for (int i = 0; i < outer; ++i) from += index[i] * stride[perm[i]];
    std::memcpy(dst + written, src + from * static_cast<int64_t>(element), run);
    int i = outer - 1;
    while (i >= 0 && ++index[i] == out_dims[i]) index[i--] = 0;
    if (i < 0) break;
  }
  return out;
}

Tensor Transposed(const Tensor& t, int64_t rows, int64_t cols) { return Permuted(t, {rows, cols}, {1, 0}); }

// Columns [begin, begin + count) of a row-major [rows, cols] tensor.
Tensor Columns(const Tensor& t, int64_t rows, int64_t cols, int64_t begin, int64_t count) {
  Tensor out = Tensor::Empty(Shape({rows, count}), t.dtype());
  CopyBox(t.raw_data(), {rows, cols}, {0, begin}, out.raw_data(), {rows, count}, {0, 0}, {rows, count},
          ElementSize(t.dtype()));
  return out;
}

// The first `rows` rows of `t` (a padded vocabulary cut to the real one).
Tensor FirstRows(const Tensor& t, int64_t rows) {
  std::vector<int64_t> dims = t.shape().dims();
  if (dims.empty() || dims[0] == rows) return t;
  TESSEL_CHECK(dims[0] > rows) << "Hugging Face export: a vocabulary table of " << dims[0]
                               << " rows; expected at least the vocabulary's " << rows;
  const std::vector<int64_t> whole = dims;
  dims[0] = rows;
  Tensor out = Tensor::Empty(Shape(dims), t.dtype());
  CopyBox(t.raw_data(), whole, std::vector<int64_t>(dims.size(), 0), out.raw_data(), dims,
          std::vector<int64_t>(dims.size(), 0), dims, ElementSize(t.dtype()));
  return out;
}

// The sizes of a grouped q|k|v rule: its input features, key/value groups,
// query heads per group (0 for a k|v rule: one group per head) and head
// dimension.
struct GroupedQkvSizes {
  int64_t in, kv, group, hd;
  static GroupedQkvSizes Of(const Rule& r, int64_t heads) {
    const bool with_q = r.hf.size() == 3;
    const int64_t hd = r.hf_shapes[0][0] / heads, kv = with_q ? r.hf_shapes[1][0] / hd : heads;
    return {r.hf_shapes[0][1], kv, with_q ? heads / kv : 0, hd};
  }
  // The first Hugging Face tensor that is a key (after the query's).
  size_t first_kv() const { return group > 0 ? 1 : 0; }
};

// Hugging Face's tensors of a rule -> tessel's.
Tensor ToTessel(const Rule& r, const std::vector<Tensor>& hf, int64_t heads) {
  const std::vector<int64_t>& ts = r.tessel_shape;
  switch (r.layout) {
    case Layout::kSame:
      return hf[0].Reshape(Shape(ts));
    case Layout::kTranspose:
      return Transposed(hf[0], r.hf_shapes[0][0], r.hf_shapes[0][1]);
    case Layout::kFusedQkv: {
      const int64_t three_h = ts.back(), hd = three_h / 3 / heads;
      if (ts.size() == 1) return Permuted(hf[0], {3, heads, hd}, {1, 0, 2}).Reshape(Shape(ts));
      return Permuted(hf[0], {ts[0], 3, heads, hd}, {0, 2, 1, 3}).Reshape(Shape(ts));
    }
    case Layout::kSeparateQkv: {
      const int64_t h = r.hf_shapes[0][0], hd = h / heads;
      // [q|k|v] columns of [in, out] matrices (or the biases one after another), then head-major.
      Tensor qkv = Tensor::Empty(
          Shape(ts.size() == 1 ? std::vector<int64_t>{3, h} : std::vector<int64_t>{h, 3 * h}), hf[0].dtype());
      const size_t element = ElementSize(qkv.dtype());
      for (int j = 0; j < 3; ++j) {
        if (ts.size() == 1) {
          std::memcpy(static_cast<uint8_t*>(qkv.raw_data()) + j * h * element, hf[j].raw_data(), h * element);
        } else {
          const Tensor in_out = Transposed(hf[j], h, h);
          CopyBox(in_out.raw_data(), {h, h}, {0, 0}, qkv.raw_data(), {h, 3 * h}, {0, j * h}, {h, h}, element);
        }
      }
      if (ts.size() == 1) return Permuted(qkv, {3, heads, hd}, {1, 0, 2}).Reshape(Shape(ts));
      return Permuted(qkv, {h, 3, heads, hd}, {0, 2, 1, 3}).Reshape(Shape(ts));
    }
    case Layout::kPatchConv:
      return Transposed(hf[0], ts[1], ts[0]);  // [hidden, C p p] -> [C p p, hidden]
    case Layout::kGroupedQkv: {
      const GroupedQkvSizes g = GroupedQkvSizes::Of(r, heads);
      // [kv][group + 2][hd][in]: each group's query rows, then its k and v rows.
      Tensor rows = Tensor::Empty(Shape({g.kv, g.group + 2, g.hd, g.in}), hf[0].dtype());
      const size_t element = ElementSize(rows.dtype()), row = static_cast<size_t>(g.hd * g.in) * element;
      auto* dst = static_cast<uint8_t*>(rows.raw_data());
      for (int64_t j = 0; j < g.kv; ++j) {
        std::memcpy(dst + j * (g.group + 2) * row,
                    static_cast<const uint8_t*>(hf[0].raw_data()) + j * g.group * row, g.group * row);
        for (size_t part = 0; part < 2; ++part)
          std::memcpy(dst + (j * (g.group + 2) + g.group + static_cast<int64_t>(part)) * row,
                      static_cast<const uint8_t*>(hf[g.first_kv() + part].raw_data()) + j * row, row);
      }
      return Permuted(rows, {g.kv * (g.group + 2) * g.hd, g.in}, {1, 0});
    }
    case Layout::kInterleavedPair: {
      const int64_t ffn = r.hf_shapes[0][0], in = r.hf_shapes[0][1];
      Tensor both = Tensor::Empty(Shape({2, ffn, in}), hf[0].dtype());
      const size_t bytes = hf[0].nbytes();
      std::memcpy(both.raw_data(), hf[0].raw_data(), bytes);
      std::memcpy(static_cast<uint8_t*>(both.raw_data()) + bytes, hf[1].raw_data(), bytes);
      return Permuted(both, {2, ffn, in}, {2, 1, 0}).Reshape(Shape(ts));  // [in][ffn][gate | up]
    }
  }
  TESSEL_THROW(StatusCode::kInternal) << "Hugging Face mapping: unknown layout";
}

// tessel's tensor of a rule -> Hugging Face's tensor number `part`.
Tensor ToHuggingFace(const Rule& r, const Tensor& t, size_t part, int64_t heads) {
  const std::vector<int64_t>& ts = r.tessel_shape;
  const std::vector<int64_t>& hs = r.hf_shapes[part];
  switch (r.layout) {
    case Layout::kSame:
      return t.Reshape(Shape(hs));
    case Layout::kTranspose:
      return Transposed(t, ts[0], ts[1]);
    case Layout::kFusedQkv: {
      const int64_t three_h = ts.back(), hd = three_h / 3 / heads;
      if (ts.size() == 1) return Permuted(t, {heads, 3, hd}, {1, 0, 2}).Reshape(Shape(hs));
      return Permuted(t, {ts[0], heads, 3, hd}, {0, 2, 1, 3}).Reshape(Shape(hs));
    }
    case Layout::kSeparateQkv: {
      const int64_t h = hs[0], hd = h / heads;
      if (ts.size() == 1) {
        const Tensor qkv = Permuted(t, {heads, 3, hd}, {1, 0, 2});  // [3, heads, hd]
        Tensor out = Tensor::Empty(Shape(hs), t.dtype());
        const size_t element = ElementSize(t.dtype());
        std::memcpy(out.raw_data(), static_cast<const uint8_t*>(qkv.raw_data()) + part * h * element,
                    h * element);
        return out;
      }
      const Tensor qkv = Permuted(t, {h, heads, 3, hd}, {0, 2, 1, 3}).Reshape(Shape({h, 3 * h}));
      return Transposed(Columns(qkv, h, 3 * h, static_cast<int64_t>(part) * h, h), h, h);
    }
    case Layout::kPatchConv:
      return Transposed(t, ts[0], ts[1]).Reshape(Shape(hs));
    case Layout::kGroupedQkv: {
      const GroupedQkvSizes g = GroupedQkvSizes::Of(r, heads);
      const Tensor rows =
          Permuted(t, {g.in, g.kv * (g.group + 2) * g.hd}, {1, 0});  // [kv][group + 2][hd][in]
      const bool query = g.group > 0 && part == 0;
      const int64_t per_group = query ? g.group : 1,
                    first = query ? 0 : g.group + static_cast<int64_t>(part - g.first_kv());
      Tensor out = Tensor::Empty(Shape(hs), t.dtype());
      const size_t element = ElementSize(t.dtype()), row = static_cast<size_t>(g.hd * g.in) * element;
      for (int64_t j = 0; j < g.kv; ++j)
        std::memcpy(static_cast<uint8_t*>(out.raw_data()) + j * per_group * row,
                    static_cast<const uint8_t*>(rows.raw_data()) + (j * (g.group + 2) + first) * row,
                    per_group * row);
      return out;
    }
    case Layout::kInterleavedPair: {
      const int64_t ffn = hs[0], in = hs[1];
      const Tensor both = Permuted(t, {in, ffn, 2}, {2, 1, 0});  // [gate | up][ffn][in]
      Tensor out = Tensor::Empty(Shape(hs), t.dtype());
      std::memcpy(out.raw_data(), static_cast<const uint8_t*>(both.raw_data()) + part * out.nbytes(),
                  out.nbytes());
      return out;
    }
  }
  TESSEL_THROW(StatusCode::kInternal) << "Hugging Face mapping: unknown layout";
}

// f16 and bf16 weights as f32 (exactly): tessel's parameters are f32.
Tensor Widened(const Tensor& t) {
  if (t.dtype() == DType::kFloat32) return t;
  Tensor out = Tensor::Empty(t.shape(), DType::kFloat32);
  float* dst = out.data<float>();
  const auto* bits = static_cast<const uint16_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i)
    dst[i] = t.dtype() == DType::kBFloat16 ? std::bit_cast<float>(static_cast<uint32_t>(bits[i]) << 16)
                                           : Float16::ToFloat(bits[i]);
  return out;
}

std::string ReadSmallFile(const fs::path& path) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  TESSEL_CHECK(!error) << "Hugging Face import: cannot read " << path.string() << " (" << error.message()
                       << ")";
  TESSEL_CHECK(size <= kMaxConfigBytes) << "Hugging Face import: " << path.string() << " is " << size
                                        << " bytes; expected at most " << kMaxConfigBytes;
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json ParseJson(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TESSEL_CHECK(j.is_object()) << "Hugging Face config " << where << " is not a JSON object";
  return j;
}

// Hugging Face's activation names -> tessel's model.hidden_act.
std::string Activation(const std::string& hf, const std::string& where) {
  if (hf == "gelu") return "gelu";
  // The tanh approximation under its three names (gelu_fast computes the same function).
  if (hf == "gelu_new" || hf == "gelu_pytorch_tanh" || hf == "gelu_fast") return "gelu_tanh";
  TESSEL_THROW(StatusCode::kInvalidArgument) << "Hugging Face config " << where << ": activation '" << hf
                                             << "' is not one tessel's models have; expected gelu, or "
                                                "gelu_new / gelu_pytorch_tanh / gelu_fast (tanh)";
}

}  // namespace

config::ModelConfig ModelFromHuggingFaceConfig(const std::string& config_json, const std::string& where) {
  const nlohmann::json j = ParseJson(config_json, where);
  // Sizes are bounded (a model's sizes, not counts to allocate by): the
  // products the mapping forms of them stay far inside 64 bits.
  constexpr int64_t kMaxSize = int64_t{1} << 24;
  auto integer = [&](const char* key, std::optional<int64_t> fallback = std::nullopt) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      TESSEL_CHECK(fallback.has_value()) << "Hugging Face config " << where << " has no \"" << key << "\"";
      return *fallback;
    }
    TESSEL_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() > 0 && j[key].get<int64_t>() <= kMaxSize)
        << "Hugging Face config " << where << ": \"" << key << "\" is " << j[key].dump()
        << "; expected a positive integer up to " << kMaxSize;
    return j[key].get<int64_t>();
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    TESSEL_CHECK(j[key].is_number()) << "Hugging Face config " << where << ": \"" << key << "\" is "
                                     << j[key].dump() << "; expected a number";
    return j[key].get<double>();
  };
  auto text = [&](const char* key, const std::string& fallback) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    TESSEL_CHECK(j[key].is_string()) << "Hugging Face config " << where << ": \"" << key << "\" is "
                                     << j[key].dump() << "; expected a string";
    return j[key].get<std::string>();
  };
  // Options tessel's models do not have: refused, not ignored.
  auto require = [&](const char* key, const nlohmann::json& expected) {
    if (!j.contains(key) || j[key].is_null()) return;
    TESSEL_CHECK(j[key] == expected) << "Hugging Face config " << where << ": \"" << key << "\" is "
                                     << j[key].dump() << "; tessel's model supports only " << expected.dump();
  };
  const std::string type = text("model_type", "");
  config::ModelConfig m;
  if (type == "gpt2") {
    require("scale_attn_weights", true);
    require("scale_attn_by_inverse_layer_idx", false);
    require("add_cross_attention", false);
    require("tie_word_embeddings", true);
    m.set_arch("gpt2");
    m.set_vocab_size(integer("vocab_size"));
    m.set_hidden_size(integer("n_embd"));
    m.set_hidden_layers(integer("n_layer"));
    m.set_num_attention_heads(integer("n_head"));
    m.set_ffn_hidden_size(integer("n_inner", 4 * m.hidden_size()));
    m.set_max_position_embeddings(integer("n_positions"));
    m.set_hidden_act(Activation(text("activation_function", "gelu_new"), where));
    m.set_layernorm_epsilon(number("layer_norm_epsilon", 1e-5));
  } else if (type == "llama") {
    require("hidden_act", "silu");
    require("attention_bias", false);
    require("mlp_bias", false);
    m.set_arch("llama");
    m.set_vocab_size(integer("vocab_size"));
    m.set_hidden_size(integer("hidden_size"));
    m.set_hidden_layers(integer("num_hidden_layers"));
    m.set_num_attention_heads(integer("num_attention_heads"));
    m.set_num_key_value_heads(integer("num_key_value_heads", m.num_attention_heads()));
    m.set_ffn_hidden_size(integer("intermediate_size"));
    m.set_max_position_embeddings(integer("max_position_embeddings"));
    m.set_hidden_act("silu");
    m.set_layernorm_epsilon(number("rms_norm_eps", 1e-6));
    m.set_rope_theta(number("rope_theta", 10000));
    m.set_tie_word_embeddings(j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
                              j["tie_word_embeddings"].get<bool>());
    TESSEL_CHECK(m.num_attention_heads() > 0 && m.hidden_size() % m.num_attention_heads() == 0)
        << "Hugging Face config " << where << ": hidden size " << m.hidden_size() << " is not divisible by "
        << m.num_attention_heads() << " heads";
    require("head_dim", m.hidden_size() / m.num_attention_heads());
    TESSEL_CHECK(m.num_attention_heads() % m.num_key_value_heads() == 0)
        << "Hugging Face config " << where << ": num_attention_heads " << m.num_attention_heads()
        << " is not divisible by num_key_value_heads " << m.num_key_value_heads();
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      const nlohmann::json& r = j["rope_scaling"];
      const std::string kind = r.is_object() && r.contains("rope_type") && r["rope_type"].is_string()
                                   ? r["rope_type"].get<std::string>()
                               : r.is_object() && r.contains("type") && r["type"].is_string()
                                   ? r["type"].get<std::string>()
                                   : "";
      TESSEL_CHECK(kind == "llama3") << "Hugging Face config " << where << ": \"rope_scaling\" is "
                                     << r.dump()
                                     << "; tessel's Llama supports none (null) or rope_type \"llama3\"";
      auto scaling = [&](const char* key) {
        TESSEL_CHECK(r.contains(key) && r[key].is_number())
            << "Hugging Face config " << where << ": \"rope_scaling\" has no number \"" << key << "\"";
        return r[key].get<double>();
      };
      config::RopeScaling& out = *m.mutable_rope_scaling();
      out.set_rope_type("llama3");
      out.set_factor(scaling("factor"));
      out.set_low_freq_factor(scaling("low_freq_factor"));
      out.set_high_freq_factor(scaling("high_freq_factor"));
      const nlohmann::json& context = r.contains("original_max_position_embeddings")
                                          ? r["original_max_position_embeddings"]
                                          : nlohmann::json(nullptr);
      TESSEL_CHECK(context.is_number_integer() && context.get<int64_t>() > 0 &&
                   context.get<int64_t>() <= kMaxSize)
          << "Hugging Face config " << where << ": \"rope_scaling\" \"original_max_position_embeddings\" is "
          << context.dump() << "; expected a positive integer up to " << kMaxSize;
      out.set_original_max_position_embeddings(context.get<int64_t>());
    }
  } else if (type == "t5") {
    // The feed-forwards tessel's T5 has: v1.1's gated GELU (tanh form, as
    // Hugging Face computes "gated-gelu") and the original's ReLU.
    const std::string ff = text("feed_forward_proj", "relu");
    TESSEL_CHECK(ff == "gated-gelu" || ff == "relu")
        << "Hugging Face config " << where << ": \"feed_forward_proj\" is \"" << ff
        << "\"; tessel's T5 supports \"gated-gelu\" (T5 v1.1) and \"relu\" (the original T5)";
    require("is_encoder_decoder", true);
    require("decoder_start_token_id", 0);  // the decoder reads the labels shifted right behind a 0
    m.set_arch("t5");
    m.set_hidden_act(ff);
    m.set_vocab_size(integer("vocab_size"));
    m.set_hidden_size(integer("d_model"));
    m.set_head_dim(integer("d_kv"));
    m.set_ffn_hidden_size(integer("d_ff"));
    m.set_hidden_layers(integer("num_layers"));
    m.set_num_decoder_layers(integer("num_decoder_layers", m.hidden_layers()));
    m.set_num_attention_heads(integer("num_heads"));
    m.set_relative_attention_num_buckets(integer("relative_attention_num_buckets", 32));
    m.set_relative_attention_max_distance(integer("relative_attention_max_distance", 128));
    m.set_layernorm_epsilon(number("layer_norm_epsilon", 1e-6));
    // PretrainedConfig's default ties (the original T5); v1.1 unties.
    m.set_tie_word_embeddings(!j.contains("tie_word_embeddings") || !j["tie_word_embeddings"].is_boolean() ||
                              j["tie_word_embeddings"].get<bool>());
    // T5 has no position table; its pre-training encodes 512 tokens.
    m.set_max_seq_length(512);
  } else if (type == "bert") {
    require("position_embedding_type", "absolute");
    require("is_decoder", false);
    require("add_cross_attention", false);
    m.set_arch("bert");
    m.set_vocab_size(integer("vocab_size"));
    m.set_hidden_size(integer("hidden_size"));
    m.set_hidden_layers(integer("num_hidden_layers"));
    m.set_num_attention_heads(integer("num_attention_heads"));
    m.set_ffn_hidden_size(integer("intermediate_size"));
    m.set_max_position_embeddings(integer("max_position_embeddings"));
    m.set_type_vocab_size(integer("type_vocab_size", 2));
    // Absent: BertConfig's default, 0; null: no padding row.
    if (!j.contains("pad_token_id")) {
      m.set_pad_token_id(0);
    } else if (j["pad_token_id"].is_null()) {
      m.set_pad_token_id(-1);
    } else {
      TESSEL_CHECK(j["pad_token_id"].is_number_integer() && j["pad_token_id"].get<int64_t>() >= 0 &&
                   j["pad_token_id"].get<int64_t>() < m.vocab_size())
          << "Hugging Face config " << where << ": \"pad_token_id\" is " << j["pad_token_id"].dump()
          << "; expected a token id below vocab_size " << m.vocab_size() << " or null";
      m.set_pad_token_id(j["pad_token_id"].get<int64_t>());
    }
    m.set_hidden_act(Activation(text("hidden_act", "gelu"), where));
    m.set_layernorm_epsilon(number("layer_norm_eps", 1e-12));
  } else if (type == "vit") {
    require("qkv_bias", true);
    m.set_arch("vit");
    m.set_hidden_size(integer("hidden_size"));
    m.set_hidden_layers(integer("num_hidden_layers"));
    m.set_num_attention_heads(integer("num_attention_heads"));
    m.set_ffn_hidden_size(integer("intermediate_size"));
    m.set_hidden_act(Activation(text("hidden_act", "gelu"), where));
    m.set_layernorm_epsilon(number("layer_norm_eps", 1e-12));
    m.set_image_size(integer("image_size"));
    m.set_patch_size(integer("patch_size"));
    m.set_num_channels(integer("num_channels", 3));
    int64_t classes = 0;
    if (j.contains("id2label") && j["id2label"].is_object())
      classes = static_cast<int64_t>(j["id2label"].size());
    m.set_num_classes(integer("num_labels", classes > 0 ? classes : 2));
    TESSEL_CHECK(m.image_size() % m.patch_size() == 0)
        << "Hugging Face config " << where << ": image_size " << m.image_size()
        << " is not a multiple of patch_size " << m.patch_size();
  } else {
    TESSEL_THROW(StatusCode::kInvalidArgument) << "Hugging Face config " << where << ": model_type '" << type
                                               << "'; expected gpt2, llama, t5, bert or vit";
  }
  // T5's heads have a width of their own (d_kv).
  TESSEL_CHECK(m.arch() == "t5" || m.hidden_size() % m.num_attention_heads() == 0)
      << "Hugging Face config " << where << ": hidden size " << m.hidden_size() << " is not divisible by "
      << m.num_attention_heads() << " heads";
  m.set_initializer_range(number("initializer_range", 0.02));
  // A training length within the position table; set it to what you train on.
  if (m.arch() != "vit" && m.arch() != "t5") m.set_max_seq_length(m.max_position_embeddings());
  return m;
}

std::string HuggingFaceConfigJson(const config::ModelConfig& m, std::optional<int64_t> eos_token_id) {
  nlohmann::json j;
  const int64_t ffn = m.ffn_hidden_size() > 0 ? m.ffn_hidden_size() : 4 * m.hidden_size();
  const int64_t positions =
      m.max_position_embeddings() > 0 ? m.max_position_embeddings() : m.max_seq_length();
  const bool tanh = m.hidden_act() == "gelu_tanh";
  if (m.arch() == "gpt2" || m.arch() == "gpt") {
    j = {{"model_type", "gpt2"},
         {"architectures", {"GPT2LMHeadModel"}},
         {"vocab_size", m.vocab_size()},
         {"n_positions", positions},
         {"n_embd", m.hidden_size()},
         {"n_layer", m.hidden_layers()},
         {"n_head", m.num_attention_heads()},
         {"n_inner", ffn},
         {"activation_function", tanh ? "gelu_new" : "gelu"},
         {"layer_norm_epsilon", m.layernorm_epsilon()},
         {"resid_pdrop", m.hidden_dropout_prob()},
         {"embd_pdrop", m.embedding_dropout_prob()},
         {"attn_pdrop", m.attention_dropout_prob()},
         {"tie_word_embeddings", true}};
  } else if (m.arch() == "llama") {
    j = {{"model_type", "llama"},
         {"architectures", {"LlamaForCausalLM"}},
         {"vocab_size", m.vocab_size()},
         {"hidden_size", m.hidden_size()},
         {"intermediate_size", ffn},
         {"num_hidden_layers", m.hidden_layers()},
         {"num_attention_heads", m.num_attention_heads()},
         {"num_key_value_heads",
          m.num_key_value_heads() > 0 ? m.num_key_value_heads() : m.num_attention_heads()},
         {"max_position_embeddings", positions},
         {"hidden_act", "silu"},
         {"rms_norm_eps", m.layernorm_epsilon()},
         {"rope_theta", m.rope_theta()},
         {"rope_scaling", nullptr},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", m.tie_word_embeddings()}};
    if (m.rope_scaling().rope_type() == "llama3") {
      // The form transformers reads since 4.43 (4.40 knows linear and dynamic only).
      const config::RopeScaling& r = m.rope_scaling();
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor()},
                           {"low_freq_factor", r.low_freq_factor()},
                           {"high_freq_factor", r.high_freq_factor()},
                           {"original_max_position_embeddings", r.original_max_position_embeddings()}};
    }
  } else if (m.arch() == "t5") {
    j = {{"model_type", "t5"},
         {"architectures", {"T5ForConditionalGeneration"}},
         {"vocab_size", m.vocab_size()},
         {"d_model", m.hidden_size()},
         {"d_kv", m.head_dim() > 0 ? m.head_dim() : m.hidden_size() / m.num_attention_heads()},
         {"d_ff", ffn},
         {"num_layers", m.hidden_layers()},
         {"num_decoder_layers", m.num_decoder_layers() > 0 ? m.num_decoder_layers() : m.hidden_layers()},
         {"num_heads", m.num_attention_heads()},
         {"relative_attention_num_buckets", m.relative_attention_num_buckets()},
         {"relative_attention_max_distance", m.relative_attention_max_distance()},
         {"feed_forward_proj", m.hidden_act() == "relu" ? "relu" : "gated-gelu"},
         {"layer_norm_epsilon", m.layernorm_epsilon()},
         {"dropout_rate", 0.0},
         {"is_encoder_decoder", true},
         {"decoder_start_token_id", 0},
         {"pad_token_id", 0},
         {"eos_token_id", eos_token_id.value_or(1)},
         {"tie_word_embeddings", m.tie_word_embeddings()}};
  } else if (m.arch() == "bert") {
    j = {{"model_type", "bert"},
         {"architectures", {"BertForPreTraining"}},
         {"vocab_size", m.vocab_size()},
         {"hidden_size", m.hidden_size()},
         {"num_hidden_layers", m.hidden_layers()},
         {"num_attention_heads", m.num_attention_heads()},
         {"intermediate_size", ffn},
         {"hidden_act", tanh ? "gelu_new" : "gelu"},
         {"max_position_embeddings", positions},
         {"type_vocab_size", m.type_vocab_size()},
         {"pad_token_id", m.pad_token_id() >= 0 ? nlohmann::json(m.pad_token_id()) : nlohmann::json(nullptr)},
         {"layer_norm_eps", m.layernorm_epsilon()},
         {"hidden_dropout_prob", m.hidden_dropout_prob()},
         {"attention_probs_dropout_prob", m.attention_dropout_prob()},
         {"position_embedding_type", "absolute"}};
  } else if (m.arch() == "vit") {
    nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
    for (int64_t c = 0; c < m.num_classes(); ++c) {
      id2label[std::to_string(c)] = "LABEL_" + std::to_string(c);
      label2id["LABEL_" + std::to_string(c)] = c;
    }
    j = {{"model_type", "vit"},
         {"architectures", {"ViTForImageClassification"}},
         {"hidden_size", m.hidden_size()},
         {"num_hidden_layers", m.hidden_layers()},
         {"num_attention_heads", m.num_attention_heads()},
         {"intermediate_size", ffn},
         {"hidden_act", tanh ? "gelu_new" : "gelu"},
         {"layer_norm_eps", m.layernorm_epsilon()},
         {"image_size", m.image_size()},
         {"patch_size", m.patch_size()},
         {"num_channels", m.num_channels()},
         {"qkv_bias", true},
         {"id2label", id2label},
         {"label2id", label2id},
         {"hidden_dropout_prob", m.hidden_dropout_prob()},
         {"attention_probs_dropout_prob", m.attention_dropout_prob()}};
  } else {
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "Hugging Face export: model.arch '" << m.arch() << "'; expected gpt2, llama, t5, bert or vit";
  }
  j["initializer_range"] = m.initializer_range();
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

std::vector<std::string> HuggingFaceMappedParameters(const config::ModelConfig& model) {
  std::vector<std::string> names;
  for (const Rule& r : Rules(model)) names.push_back(r.tessel);
  return names;
}

HuggingFaceImport ReadHuggingFace(const fs::path& dir) {
  HuggingFaceImport out;
  const fs::path config_path = dir / "config.json";
  out.model = ModelFromHuggingFaceConfig(ReadSmallFile(config_path), config_path.string());
  const config::ModelConfig& m = out.model;
  // The weights: one file, or an index naming the shards of each tensor.
  std::vector<std::unique_ptr<zoo::SafetensorsFile>> files;
  if (fs::exists(dir / "model.safetensors")) {
    files.push_back(std::make_unique<zoo::SafetensorsFile>(dir / "model.safetensors"));
  } else {
    const fs::path index_path = dir / "model.safetensors.index.json";
    TESSEL_CHECK(fs::exists(index_path))
        << "Hugging Face import: " << dir.string()
        << " has neither model.safetensors nor model.safetensors.index.json (save the model with "
           "save_pretrained(..., safe_serialization=True); pytorch_model.bin is not read)";
    const nlohmann::json index = ParseJson(ReadSmallFile(index_path), index_path.string());
    TESSEL_CHECK(index.contains("weight_map") && index["weight_map"].is_object())
        << "Hugging Face import: " << index_path.string() << " has no \"weight_map\" object";
    std::set<std::string> shards;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      TESSEL_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos)
          << "Hugging Face import: " << index_path.string() << ": tensor '" << tensor << "' maps to "
          << file.dump() << "; expected a file name beside the index";
      shards.insert(file.get<std::string>());
    }
    for (const std::string& shard : shards)
      files.push_back(std::make_unique<zoo::SafetensorsFile>(dir / shard));
  }
  std::map<std::string, const zoo::SafetensorsFile*> where;
  for (const auto& f : files)
    for (const auto& [name, entry] : f->entries()) where[name] = f.get();
  std::set<std::string> used;
  // A name of the full model (transformer.h.0..., bert.encoder...), or the
  // same without the base model's prefix (a checkpoint of the base model, or
  // of GPT-2 as first published).
  auto find = [&](const std::string& name, const std::vector<std::string>& aliases) -> std::string {
    std::vector<std::string> candidates = {name};
    candidates.insert(candidates.end(), aliases.begin(), aliases.end());
    for (const char* base : {"transformer.", "bert.", "vit.", "model."})
      if (name.rfind(base, 0) == 0) candidates.push_back(name.substr(std::strlen(base)));
    for (const std::string& c : candidates)
      if (where.count(c)) return c;
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "Hugging Face import: " << dir.string() << " has no tensor '" << name << "' (a " << m.arch()
        << " with " << m.hidden_layers() << " layers needs it)";
  };
  const int64_t heads = m.num_attention_heads();
  for (const Rule& r : Rules(m)) {
    std::vector<Tensor> hf;
    for (size_t k = 0; k < r.hf.size(); ++k) {
      const std::string name = find(r.hf[k], r.aliases);
      const zoo::SafetensorsFile& file = *where.at(name);
      const zoo::SafetensorsEntry& entry = file.entry(name);
      TESSEL_CHECK(entry.shape == r.hf_shapes[k])
          << "Hugging Face import: " << file.path().string() << ": tensor '" << name << "' has shape "
          << ShapeText(entry.shape) << "; its config.json implies " << ShapeText(r.hf_shapes[k]);
      TESSEL_CHECK(entry.dtype == "F32" || entry.dtype == "F16" || entry.dtype == "BF16")
          << "Hugging Face import: " << file.path().string() << ": tensor '" << name << "' is " << entry.dtype
          << "; expected F32, F16 or BF16";
      hf.push_back(Widened(file.tensor(name)));
      used.insert(name);
    }
    out.tensors.emplace_back(r.tessel, ToTessel(r, hf, heads));
  }
  // Everything else must be a tied copy (equal to what tessel ties it to)
  // or a buffer derived from the config.
  std::map<std::string, std::string> tied = {
      {"lm_head.weight", m.arch() == "llama" ? "embed_tokens.weight" : "wte.weight"},
      {"cls.predictions.decoder.weight", "word_embeddings.weight"},
      {"cls.predictions.decoder.bias", "mlm_bias"}};
  if (m.arch() == "t5")
    tied = {{"lm_head.weight", "shared.weight"},
            {"encoder.embed_tokens.weight", "shared.weight"},
            {"decoder.embed_tokens.weight", "shared.weight"}};
  std::vector<std::string> unknown;
  for (const auto& [name, file] : where) {
    if (used.count(name)) continue;
    const auto tie = tied.find(name);
    if (tie != tied.end()) {
      const auto own = std::find_if(out.tensors.begin(), out.tensors.end(),
                                    [&](const auto& p) { return p.first == tie->second; });
      const Tensor copy = Widened(file->tensor(name));  // compared as the f32 it was imported as
      TESSEL_CHECK(own != out.tensors.end() && copy.shape() == own->second.shape() &&
                   std::memcmp(copy.raw_data(), own->second.raw_data(), copy.nbytes()) == 0)
          << "Hugging Face import: " << file->path().string() << ": tensor '" << name
          << "' differs from the embedding it is tied to in tessel's " << m.arch()
          << " (an untied output layer is not supported)";
      continue;
    }
    const bool buffer = name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
                        name.ends_with("embeddings.position_ids") || name.ends_with("rotary_emb.inv_freq");
    if (!buffer) unknown.push_back(name);
  }
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 10; ++i) list.append(i ? ", " : "").append(unknown[i]);
    TESSEL_THROW(StatusCode::kInvalidArgument)
        << "Hugging Face import: " << dir.string() << " holds " << unknown.size() << " tensor(s) tessel's "
        << m.arch() << " has no place for: " << list << (unknown.size() > 10 ? ", ..." : "")
        << " (another architecture?)";
  }
  return out;
}

void WriteHuggingFace(const fs::path& dir, const config::ModelConfig& model,
                      const std::function<Tensor(const std::string& name)>& tensor,
                      std::optional<int64_t> eos_token_id) {
  const std::vector<Rule> rules = Rules(model);
  const std::string config = HuggingFaceConfigJson(model, eos_token_id);
  std::error_code error;
  fs::create_directories(dir, error);
  TESSEL_CHECK(!error) << "Hugging Face export: cannot create " << dir.string() << ": " << error.message();
  // The parameter of the last rule read stays, for the three parts of a
  // separate QKV; the writer holds one parameter at a time.
  struct Last {
    std::string name;
    Tensor value;
  };
  auto last = std::make_shared<Last>();
  const int64_t heads = model.num_attention_heads();
  std::vector<zoo::SafetensorsSource> sources;
  for (const Rule& r : rules) {
    for (size_t k = 0; k < r.hf.size(); ++k) {
      sources.push_back(
          {r.hf[k], "F32", r.hf_shapes[k], [&, r, k, last](const zoo::SafetensorsSource::Sink& write) {
             if (last->name != r.tessel) {
               Tensor t = tensor(r.tessel);
               TESSEL_CHECK(t.dtype() == DType::kFloat32)
                   << "Hugging Face export: parameter '" << r.tessel << "' is " << DTypeName(t.dtype())
                   << "; expected f32";
               if (r.vocabulary_rows) t = FirstRows(t, r.tessel_shape[0]);
               TESSEL_CHECK(t.shape().dims() == r.tessel_shape)
                   << "Hugging Face export: parameter '" << r.tessel << "' has shape " << t.shape()
                   << "; the model config implies " << ShapeText(r.tessel_shape);
               *last = {r.tessel, t};
             }
             const Tensor part = ToHuggingFace(r, last->value, k, heads);
             write(part.raw_data(), part.nbytes());
           }});
    }
  }
  // Each file is written beside its name and renamed over it when complete.
  zoo::WriteSafetensors(dir / "model.safetensors.tmp", sources, {{"format", "pt"}});
  {
    std::ofstream out(dir / "config.json.tmp", std::ios::binary | std::ios::trunc);
    out << config;
    out.flush();
    TESSEL_CHECK(out.good()) << "Hugging Face export: cannot write " << (dir / "config.json.tmp").string();
  }
  fs::rename(dir / "model.safetensors.tmp", dir / "model.safetensors");
  fs::rename(dir / "config.json.tmp", dir / "config.json");
}

}  // namespace tessel::checkpoint
