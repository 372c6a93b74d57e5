// T5 (models/t5.h) pre-trained by span corruption (zoo/t5_span_corruption.h)
// on a Megatron-format indexed dataset, or a blend of several by weight:
// the documents concatenated and cut into sequences of the raw length whose
// corrupted inputs fit model.max_seq_length (zoo/gpt_samples.h), each
// corrupted with spans drawn from the run's seed and the sample's place in
// the run. The encoder reads the kept tokens and a sentinel per span, the
// decoder the targets shifted right; evaluation reports the loss and
// perplexity over the targets.
#include <cmath>
#include <cstdio>
#include <memory>

#include "graph/autograd.h"
#include "layers/optimizer.h"
#include "models/t5.h"
#include "tools/train/model_config.h"
#include "tools/train/task.h"
#include "zoo/gpt_samples.h"
#include "zoo/t5_span_corruption.h"

namespace tessel::train {
namespace {

using zoo::Corpus;
using zoo::GPTSamples;

// The options of the config's span corruption.
zoo::SpanCorruptionOptions SpanOptions(const config::Config& c) {
  return {.noise_density = c.data().noise_density(),
          .mean_span_length = c.data().mean_noise_span_length(),
          .vocab_size = c.model().vocab_size(),
          .eos_id = c.data().eos_token_id()};
}

class T5Task : public Task {
 public:
  explicit T5Task(const TaskContext& context)
      : c_(context.config),
        micro_batches_(context.micro_batches),
        global_(c_.train().global_batch_size()),
        options_(SpanOptions(c_)),
        raw_(zoo::SpanCorruptionRawLength(c_.model().max_seq_length(), options_)),
        lengths_(zoo::SpanCorruptionLengths(raw_, options_)) {
    const config::ModelConfig& m = c_.model();
    // The sentinels are the vocabulary's last ids: every ordinary id, eos
    // included, must lie below them.
    const int64_t lowest_sentinel = m.vocab_size() - lengths_.spans;
    TESSEL_CHECK(options_.eos_id < lowest_sentinel)
        << "tessel-train: data.eos_token_id " << options_.eos_id << " is among the " << lengths_.spans
        << " sentinel ids (" << lowest_sentinel << " .. " << m.vocab_size() - 1 << ") span corruption of a "
        << raw_ << "-token sequence needs; expected model.vocab_size of at least "
        << options_.eos_id + 1 + lengths_.spans;
    std::vector<double> weights;
    corpora_ = zoo::OpenCorpora(c_.data(), &weights);
    for (const auto& corpus : corpora_) {
      const int64_t max_token = corpus->data.MaxToken();
      TESSEL_CHECK(max_token < lowest_sentinel)
          << "tessel-train: dataset " << corpus->data.prefix() << " holds token id " << max_token
          << " but the " << lengths_.spans << " sentinels of a " << raw_ << "-token sequence are ids "
          << lowest_sentinel << " .. " << m.vocab_size() - 1
          << " (the vocabulary's last); expected model.vocab_size of at least "
          << max_token + 1 + lengths_.spans;
      CheckValidationDocuments(corpus->splits, corpus->data.num_documents(), c_);
    }
    const config::TrainConfig& t = c_.train();
    // GPTSamples gives seq + 1 tokens per sample: raw_ of them.
    train_ = std::make_unique<GPTSamples>(corpora_, weights, 0, raw_ - 1, t.train_iter() * global_, t.seed(),
                                          "train");
    if (c_.evaluation().enabled()) {
      eval_ = std::make_unique<GPTSamples>(corpora_, weights, 1, raw_ - 1,
                                           c_.evaluation().eval_iter() * global_, t.seed() + 1, "validation");
    }
    model_ = std::make_unique<models::T5>(T5ConfigOf(c_));
    eval_step_ = std::make_unique<Graph>(
        "eval_step",
        [this](const Graph::Tensors& in) {
          return Graph::Tensors{{"loss", Loss(in)}};
        },
        context.eval_graph);
  }

  nn::Module& model() override { return *model_; }
  Tensor Loss(const Graph::Tensors& in) const override {
    return model_->Loss(in.at("input_ids"), in.at("decoder_input_ids"), in.at("labels"));
  }
  int64_t tokens_per_sample() const override { return lengths_.inputs + lengths_.targets; }

  // Megatron's count for an encoder-decoder: each stack's projections over
  // its own tokens, the decoder's cross-attention keys and values over the
  // encoder's, the score products over the keys each query sees (no causal
  // halving), the logits over the decoder's tokens.
  double TrainFlopsPerSample() const override {
    const config::ModelConfig& m = c_.model();
    const double h = static_cast<double>(m.hidden_size());
    const double inner = static_cast<double>(m.num_attention_heads() * m.head_dim());
    const double ffn = static_cast<double>(m.ffn_hidden_size());
    const double mlp = (m.hidden_act() == "gated-gelu" ? 3 : 2) * h * ffn;
    const double s = static_cast<double>(lengths_.inputs), t = static_cast<double>(lengths_.targets);
    const double encoder_layer = s * (2 * (4 * h * inner + mlp) + 4 * s * inner);
    const double decoder_layer = t * (2 * (4 * h * inner + mlp) + 4 * t * inner)  // self-attention, MLP
                                 + t * (2 * 2 * h * inner + 4 * s * inner)        // cross: q, o, scores
                                 + s * 2 * 2 * h * inner;                         // cross: k, v
    const double forward = static_cast<double>(m.hidden_layers()) * encoder_layer +
                           static_cast<double>(m.num_decoder_layers()) * decoder_layer +
                           t * 2 * h * static_cast<double>(m.vocab_size());
    return 3 * forward;
  }
  std::map<std::string, int64_t> PaddedRows() const override {
    std::map<std::string, int64_t> rows = {{"shared.weight", c_.model().vocab_size()}};
    if (!c_.model().tie_word_embeddings()) rows["lm_head.weight"] = c_.model().vocab_size();
    return rows;
  }

  Graph::Tensors ReadTrain(int64_t iteration, int part, int parts) const override {
    return Read(*train_, iteration * global_, part, parts, c_.train().seed());
  }

  std::vector<Metric> Evaluate(bool graph_mode) override {
    double total = 0;
    const int64_t batches = c_.evaluation().eval_iter();
    const uint64_t seed = c_.train().seed() + 1;
    for (int64_t k = 0; k < batches; ++k) {
      if (graph_mode) {
        total += optim::ScalarValue((*eval_step_)(Read(*eval_, k * global_, 0, 1, seed)).at("loss"));
        continue;
      }
      NoGradGuard no_grad;
      double batch = 0;
      for (int part = 0; part < micro_batches_; ++part)
        batch += optim::ScalarValue(Loss(Read(*eval_, k * global_, part, micro_batches_, seed)));
      total += batch / micro_batches_;
    }
    const double loss = total / static_cast<double>(batches);
    return {{"loss", loss}, {"perplexity", std::exp(loss)}};
  }

  std::string DataSummary() const override {
    char line[320];
    size_t validation = 0;
    for (const auto& corpus : corpora_) validation += corpus->splits[1].size();
    std::snprintf(line, sizeof(line),
                  "vocab %ld; span corruption of %ld tokens: encoder %ld, decoder %ld (%ld spans, sentinels "
                  "%ld..%ld, eos %ld); train ",
                  static_cast<long>(options_.vocab_size), static_cast<long>(raw_),
                  static_cast<long>(lengths_.inputs), static_cast<long>(lengths_.targets),
                  static_cast<long>(lengths_.spans), static_cast<long>(options_.vocab_size - lengths_.spans),
                  static_cast<long>(options_.vocab_size - 1), static_cast<long>(options_.eos_id));
    return line + train_->Summary(corpora_, 0) + ", validation " + std::to_string(validation) + " documents";
  }

 private:
  // Rows first_sample + FirstRow .. of `data`, corrupted: the encoder's and
  // decoder's ids on the first stage (the token table is there), the
  // targets on the last.
  Graph::Tensors Read(const GPTSamples& data, int64_t first_sample, int part, int parts,
                      uint64_t seed) const {
    const BatchLayout layout = BatchLayout::ForWorld(global_);
    const bool needs_inputs = layout.ReadsInputs(), needs_labels = layout.ReadsLabels();
    const int64_t local_rows = layout.LocalRows(parts);
    const int64_t s = lengths_.inputs, t = lengths_.targets;
    std::vector<int64_t> inputs, targets, tokens;
    if (needs_inputs || needs_labels) {
      const int64_t begin = first_sample + layout.FirstRow(part, parts);
      for (int64_t i = 0; i < local_rows; ++i) {
        tokens.clear();
        data.Sample((begin + i) % data.size(), &tokens);
        // The sample's place in the run picks its spans: the same on every
        // rank and layout, new ones when the data wraps into another epoch.
        const uint64_t sample_seed = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(begin + i);
        zoo::SpanCorrupted corrupted = zoo::CorruptSpans(tokens, options_, sample_seed);
        inputs.insert(inputs.end(), corrupted.inputs.begin(), corrupted.inputs.end());
        targets.insert(targets.end(), corrupted.targets.begin(), corrupted.targets.end());
      }
    }
    // A rank outside a placement gives no rows, in the inputs' dtype.
    auto rows = [&](bool needed, const std::vector<int64_t>& values, int64_t length) {
      return needed ? Tensor::FromVector<int64_t>(values, {local_rows, length})
                    : Tensor::FromVector<int64_t>({}, {0, length});
    };
    const int64_t batch = global_ / parts;
    return {{"input_ids", layout.OnFirst(rows(needs_inputs, inputs, s), Shape({batch, s}))},
            {"decoder_input_ids",
             layout.OnFirst(rows(needs_inputs, models::T5::ShiftRight(targets, t), t), Shape({batch, t}))},
            {"labels", layout.OnLast(rows(needs_labels, targets, t), Shape({batch, t}))}};
  }

  const config::Config& c_;
  int micro_batches_;
  int64_t global_;
  zoo::SpanCorruptionOptions options_;
  int64_t raw_;  // tokens per sample before corruption
  zoo::SpanCorruptedLengths lengths_;
  std::vector<std::unique_ptr<Corpus>> corpora_;
  std::unique_ptr<GPTSamples> train_, eval_;
  std::unique_ptr<models::T5> model_;
  std::unique_ptr<Graph> eval_step_;
};

}  // namespace

std::unique_ptr<Task> MakeT5Task(const TaskContext& context) { return std::make_unique<T5Task>(context); }

}  // namespace tessel::train
