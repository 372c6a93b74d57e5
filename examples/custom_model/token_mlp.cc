// token_mlp: tessel's training program with a model of this project's own,
// registered as model.arch "token_mlp" (token_mlp.prototxt; docs/
// extending.md walks through it).
//
// The model is a language model without attention: each token's next is
// predicted from the token alone, through a vocabulary-parallel embedding,
// hidden_layers residual MLP blocks (pre-LayerNorm; column- then
// row-parallel) and an output layer over the vocabulary (a table of its
// own on the last stage, or the embedding's), with the vocabulary-parallel
// cross-entropy. The output table is a layer of this project's own: each
// rank makes its rows of the table, picked by its index along the "tp"
// axis (dist::AxisRank), as a layer that loads a pre-sharded table would. It is built from tessel's
// layers, and each block's layer_idx is its pipeline stage's, so it trains
// under any dp x tp x pp layout, eagerly or in graph mode, and tessel-train
// gives it what the zoo's models get: data, evaluation (loss, perplexity),
// checkpoints and resume, metrics.jsonl and TensorBoard.
//
// Its own setting, model.options: tied_output ("true" or "false", default
// "false"): whether the output layer is the embedding's table (as GPT-2's)
// or a table of its own.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "layers/common.h"
#include "layers/dist.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/transformer.h"
#include "tools/train/model_registry.h"
#include "tools/train/training_program.h"

namespace {

using namespace tessel;
using namespace tessel::sbp_shorthand;  // S(d), B(), P()

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

// The output table [vocabulary, hidden] on the last stage, split on the
// vocabulary over the tensor-parallel ranks. Each rank makes only its own
// rows, the block its index along the "tp" axis picks, each element drawn
// from a hash of its logical index (so every layout holds the same table),
// and hands them to tessel as its shard.
struct OutputTable : nn::Module {
  OutputTable(int64_t vocab, int64_t hidden, uint64_t seed, double init_std) {
    TESSEL_CHECK(!dist::MultiAxisTensorParallel())
        << "token_mlp: tensor_parallel_mode '" << dist::GetConfig().tensor_parallel_mode
        << "' is not supported; its output table is split over tp as 1d splits it";
    const Placement last = dist::GetLayerPlacement(-1);
    const int64_t parts = dist::AxisSize("tp"), part = dist::AxisRank("tp");
    const int64_t rows = last.Contains(dist::Rank()) ? vocab / parts : 0;  // none off the last stage
    std::vector<float> values(static_cast<size_t>(rows * hidden));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < hidden; ++j) {
        const uint64_t index = static_cast<uint64_t>((part * (vocab / parts) + i) * hidden + j);
        values[static_cast<size_t>(i * hidden + j)] = static_cast<float>(init_std * Uniform(seed, index));
      }
    NoGradGuard no_grad;
    const Shape shape({vocab, hidden});
    const NdSbp split = dist::GetNdSbp({B(), S(0)});
    weight = FromLocal(Tensor::FromVector(values, {rows, hidden}), last, split, shape)
                 .to_global(last, dist::GetParameterNdSbp(shape, split));  // (ZeRO 3 splits it over dp too)
    RegisterParameter("weight", weight);
  }
  // In [-sqrt(3), sqrt(3)): a variance of one. splitmix64 of seed and index.
  static double Uniform(uint64_t seed, uint64_t index) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return std::sqrt(3.0) * (2.0 * static_cast<double>(z >> 11) / 9007199254740992.0 - 1.0);
  }
  Tensor weight;
};

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
      output_ = std::make_unique<OutputTable>(padded_vocab_, c.hidden, c.seed + 1, c.init_std);
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
  std::unique_ptr<OutputTable> output_;  // none when tied
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
