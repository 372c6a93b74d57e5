// token_mlp: tessel's training program with a model of this project's own,
// registered as model.arch "token_mlp" (token_mlp.prototxt; docs/
// extending.md walks through it).
//
// The model is a language model without attention: each token's next is
// predicted from the token alone, through a vocabulary-parallel embedding,
// hidden_layers residual MLP blocks (pre-LayerNorm; column- then
// row-parallel) and an output layer over the vocabulary (a table of its
// own on the last stage, or the embedding's), with the vocabulary-parallel
// cross-entropy. It is built from tessel's
// layers, and each block's layer_idx is its pipeline stage's, so it trains
// under any dp x tp x pp layout, eagerly or in graph mode, and tessel-train
// gives it what the zoo's models get: data, evaluation (loss, perplexity),
// checkpoints and resume, metrics.jsonl and TensorBoard.
//
// Its own setting, model.options: tied_output ("true" or "false", default
// "false"): whether the output layer is the embedding's table (as GPT-2's)
// or a table of its own.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/autograd.h"
#include "layers/common.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "tools/train/model_registry.h"
#include "tools/train/training_program.h"

namespace {

using namespace tessel;

struct TokenMlpConfig {
  int64_t vocab_size, hidden, ffn_hidden, layers;
  double layernorm_epsilon, init_std;
  bool tied_output;
  uint64_t seed;
};

// model.options, checked: an unknown key or a bad value is named.
bool TiedOutput(const config::ModelConfig& m) {
  bool tied = false;
  for (const auto& [key, value] : m.options()) {
    TESSEL_CHECK(key == "tied_output")
        << "token_mlp: model.options has '" << key << "'; the options are: tied_output";
    TESSEL_CHECK(value == "true" || value == "false")
        << "token_mlp: model.options tied_output is '" << value << "'; expected true or false";
    tied = value == "true";
  }
  return tied;
}

class TokenMlp : public nn::Module {
 public:
  explicit TokenMlp(const TokenMlpConfig& c)
      : c_(c),
        padded_vocab_(layers::PaddedVocabSizeLogged("token_mlp", c.vocab_size, 128)),
        embedding_(padded_vocab_, c.hidden, {.layer_idx = 0, .seed = c.seed, .init_std = c.init_std}),
        ln_f_(c.hidden, c.layernorm_epsilon, -1) {
    RegisterModule("embedding", embedding_);
    for (int64_t i = 0; i < c.layers; ++i) {
      blocks_.push_back(std::make_unique<Block>(c, i));
      RegisterModule("block" + std::to_string(i), *blocks_.back());
    }
    RegisterModule("ln_f", ln_f_);
    if (!c.tied_output) {
      // [vocab, hidden] on the last stage (layer -1), split on the vocabulary.
      output_ = std::make_unique<layers::VocabEmbedding>(
          padded_vocab_, c.hidden,
          layers::EmbeddingOptions{.layer_idx = -1, .seed = c.seed + 1, .init_std = c.init_std});
      RegisterModule("output", *output_);
    }
  }

  // Mean next-token cross-entropy of ids [batch, seq] against labels.
  Tensor Loss(const Tensor& ids, const Tensor& labels) const {
    Tensor h = embedding_(ids);
    for (const auto& block : blocks_) h = (*block)(h);
    LayerScope last(c_.layers - 1);
    const Tensor& table = output_ ? output_->weight : embedding_.weight;
    const Tensor logits = layers::LMLogits(ln_f_(h), layers::ForCompute(table));
    return layers::ParallelCrossEntropyLoss(layers::MaskPaddedLogits(logits, c_.vocab_size), labels);
  }

  int64_t padded_vocab() const { return padded_vocab_; }

 private:
  // x + fc2(gelu(fc1(LayerNorm(x)))), on layer `index`'s pipeline stage.
  struct Block : nn::Module {
    Block(const TokenMlpConfig& c, int64_t index)
        : index(index),
          ln(c.hidden, c.layernorm_epsilon, index),
          mlp(c.hidden, c.ffn_hidden, index, c.seed + 100 * static_cast<uint64_t>(index + 1), c.init_std,
              layers::Activation::kGeluTanh) {
      RegisterModule("ln", ln);
      RegisterModule("mlp", mlp);
    }
    Tensor operator()(const Tensor& in) const {
      LayerScope scope(index);  // a trace tags this block's ops (and their gradients) with its layer
      const Tensor x = layers::ToActivations(in, ln.weight.placement());  // onto this block's stage
      return mlp(ln(x), x);
    }
    int64_t index;
    layers::LayerNorm ln;
    layers::MLP mlp;
  };

  TokenMlpConfig c_;
  int64_t padded_vocab_;
  layers::VocabEmbedding embedding_;
  std::vector<std::unique_ptr<Block>> blocks_;
  layers::LayerNorm ln_f_;
  std::unique_ptr<layers::VocabEmbedding> output_;  // none when tied
};

// The factory tessel-train calls with the resolved config, under the dist
// layout it set up.
train::CausalLM BuildTokenMlp(const config::Config& config) {
  const config::ModelConfig& m = config.model();
  auto model = std::make_unique<TokenMlp>(TokenMlpConfig{.vocab_size = m.vocab_size(),
                                                         .hidden = m.hidden_size(),
                                                         .ffn_hidden = m.ffn_hidden_size(),
                                                         .layers = m.hidden_layers(),
                                                         .layernorm_epsilon = m.layernorm_epsilon(),
                                                         .init_std = m.initializer_range(),
                                                         .tied_output = TiedOutput(m),
                                                         .seed = config.train().seed()});
  const TokenMlp* lm = model.get();
  // The tables' rows past the vocabulary are padding (so a checkpoint loads
  // under a tp that pads otherwise).
  std::map<std::string, int64_t> padded_rows = {{"embedding.weight", m.vocab_size()}};
  if (!TiedOutput(m)) padded_rows["output.weight"] = m.vocab_size();
  const double h = static_cast<double>(m.hidden_size()), ffn = static_cast<double>(m.ffn_hidden_size());
  return {.module = std::move(model),
          .loss = [lm](const Tensor& ids, const Tensor& labels) { return lm->Loss(ids, labels); },
          .padded_rows = std::move(padded_rows),
          // Two matmuls per block and the output layer, 2 FLOPs per
          // multiply-add.
          .forward_flops_per_token = static_cast<double>(m.hidden_layers()) * 2 * (2 * h * ffn) +
                                     2 * h * static_cast<double>(lm->padded_vocab())};
}

}  // namespace

int main(int argc, char** argv) {
  train::RegisterCausalLM("token_mlp", BuildTokenMlp);
  return train::RunTrainingProgram(argc, argv);
}
