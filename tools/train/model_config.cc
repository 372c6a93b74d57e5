#include "tools/train/model_config.h"

#include "core/error.h"

namespace tessel::train {

layers::Activation HiddenActivation(const config::ModelConfig& m) {
  return m.hidden_act() == "gelu" ? layers::Activation::kGelu : layers::Activation::kGeluTanh;
}

models::GPTConfig GptConfigOf(const config::Config& c) {
  const config::ModelConfig& m = c.model();
  return {.vocab_size = m.vocab_size(),
          .hidden = m.hidden_size(),
          .heads = m.num_attention_heads(),
          .layers = m.hidden_layers(),
          .max_seq = m.max_position_embeddings(),
          .ffn_hidden = m.ffn_hidden_size(),
          .layernorm_epsilon = m.layernorm_epsilon(),
          .init_std = m.initializer_range(),
          .seed = c.train().seed(),
          .activation = HiddenActivation(m),
          .embedding_dropout = m.embedding_dropout_prob(),
          .attention_dropout = m.attention_dropout_prob(),
          .hidden_dropout = m.hidden_dropout_prob(),
          .fused_attention = m.fused_attention(),
          .make_vocab_size_divisible_by = m.make_vocab_size_divisible_by(),
          .activation_checkpoint = c.train().activation_checkpoint()};
}

models::LlamaConfig LlamaConfigOf(const config::Config& c) {
  const config::ModelConfig& m = c.model();
  fn::RotaryOptions rope{.theta = m.rope_theta()};
  if (m.rope_scaling().rope_type() == "llama3") {
    const config::RopeScaling& r = m.rope_scaling();
    rope.scaling_factor = r.factor();
    rope.low_freq_factor = r.low_freq_factor();
    rope.high_freq_factor = r.high_freq_factor();
    rope.original_max_positions = r.original_max_position_embeddings();
  }
  return {.vocab_size = m.vocab_size(),
          .hidden = m.hidden_size(),
          .heads = m.num_attention_heads(),
          .kv_heads = m.num_key_value_heads(),
          .layers = m.hidden_layers(),
          .ffn_hidden = m.ffn_hidden_size(),
          .max_seq = m.max_position_embeddings(),
          .rms_norm_eps = m.layernorm_epsilon(),
          .rope = rope,
          .tie_word_embeddings = m.tie_word_embeddings(),
          .init_std = m.initializer_range(),
          .seed = c.train().seed(),
          .make_vocab_size_divisible_by = m.make_vocab_size_divisible_by(),
          .fused_attention = m.fused_attention(),
          .activation_checkpoint = c.train().activation_checkpoint()};
}

models::T5Config T5ConfigOf(const config::Config& c) {
  const config::ModelConfig& m = c.model();
  return {.vocab_size = m.vocab_size(),
          .hidden = m.hidden_size(),
          .heads = m.num_attention_heads(),
          .head_dim = m.head_dim(),
          .ffn_hidden = m.ffn_hidden_size(),
          .encoder_layers = m.hidden_layers(),
          .decoder_layers = m.num_decoder_layers(),
          .relative_buckets = m.relative_attention_num_buckets(),
          .relative_max_distance = m.relative_attention_max_distance(),
          .layernorm_epsilon = m.layernorm_epsilon(),
          .gated_gelu = m.hidden_act() == "gated-gelu",
          .tie_word_embeddings = m.tie_word_embeddings(),
          .init_std = m.initializer_range(),
          .seed = c.train().seed(),
          .make_vocab_size_divisible_by = m.make_vocab_size_divisible_by(),
          .activation_checkpoint = c.train().activation_checkpoint()};
}

namespace {
// The CausalLM of a model whose Loss and Logits take ids (and labels).
template <typename Model>
CausalLM Wrapped(std::unique_ptr<Model> model, std::map<std::string, int64_t> padded_rows) {
  const Model* m = model.get();
  return {.module = std::move(model),
          .loss = [m](const Tensor& ids, const Tensor& labels) { return m->Loss(ids, labels); },
          .logits = [m](const Tensor& ids) { return m->Logits(ids); },
          .padded_rows = std::move(padded_rows)};
}
}  // namespace

double TransformerLayerFlopsPerToken(const config::ModelConfig& m, int64_t seq) {
  const double h = static_cast<double>(m.hidden_size());
  const double ffn = static_cast<double>(m.ffn_hidden_size() > 0 ? m.ffn_hidden_size() : 4 * m.hidden_size());
  const bool llama = m.arch() == "llama";
  // The key and value projections' width: hidden, or kv_heads x head_dim.
  const double kv = llama && m.num_key_value_heads() > 0 ? h * static_cast<double>(m.num_key_value_heads()) /
                                                               static_cast<double>(m.num_attention_heads())
                                                         : h;
  const double mlp_matrices = llama ? 3 : 2;  // SwiGLU's gate, up and down
  return 2 * (2 * h * h + 2 * h * kv + mlp_matrices * h * ffn) + 4 * static_cast<double>(seq) * h;
}

CausalLM BuildCausalLM(const config::Config& c) {
  const config::ModelConfig& m = c.model();
  CausalLM lm;
  if (m.arch() == "llama") {
    std::map<std::string, int64_t> padded = {{"embed_tokens.weight", m.vocab_size()}};
    if (!m.tie_word_embeddings()) padded["lm_head.weight"] = m.vocab_size();
    lm = Wrapped(std::make_unique<models::Llama>(LlamaConfigOf(c)), std::move(padded));
  } else {
    TESSEL_CHECK(m.arch() == "gpt2" || m.arch() == "gpt")
        << "model.arch '" << m.arch()
        << "' is not a causal language model of the zoo; expected gpt2 or llama";
    lm = Wrapped(std::make_unique<models::GPT>(GptConfigOf(c)), {{"wte.weight", m.vocab_size()}});
  }
  lm.forward_flops_per_token =
      static_cast<double>(m.hidden_layers()) * TransformerLayerFlopsPerToken(m, m.max_seq_length()) +
      2.0 * static_cast<double>(m.hidden_size() * m.vocab_size());  // the logits
  return lm;
}

}  // namespace tessel::train
