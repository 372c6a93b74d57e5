// T5 (models/t5.h) pre-trained by span corruption on a Megatron-format
// indexed dataset, or a blend of several by weight (zoo/t5_samples.h: the
// documents concatenated and cut into sequences of the raw length whose
// corrupted inputs fit model.max_seq_length, each corrupted with spans
// drawn from the run's seed and the sample's place in the run). The
// encoder reads the kept tokens and a sentinel per span, the
// decoder the targets shifted right; evaluation reports the loss and
// perplexity over the targets.
#include <cmath>
#include <cstdio>
#include <memory>

#include "models/t5.h"
#include "tools/train/model_config.h"
#include "tools/train/task.h"
#include "zoo/t5_samples.h"

namespace tessel::train {
namespace {

class T5Task : public Task {
 public:
  explicit T5Task(const TaskContext& context)
      : c_(context.config), micro_batches_(context.micro_batches), global_(c_.train().global_batch_size()) {
    std::vector<double> weights;
    corpora_ = zoo::OpenCorpora(c_.data(), &weights);
    for (const auto& corpus : corpora_)
      CheckValidationDocuments(corpus->splits, corpus->data.num_documents(), c_);
    const config::TrainConfig& t = c_.train();
    const zoo::SpanCorruptionOptions options = zoo::SpanCorruptionOptionsOf(c_);
    const int64_t encoder = c_.model().max_seq_length();
    train_ = std::make_unique<zoo::T5Samples>(corpora_, weights, 0, options, encoder,
                                              t.train_iter() * global_, t.seed(), "train");
    if (c_.evaluation().enabled()) {
      eval_ =
          std::make_unique<zoo::T5Samples>(corpora_, weights, 1, options, encoder,
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
  int64_t tokens_per_sample() const override { return train_->lengths().inputs + train_->lengths().targets; }

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
    const zoo::SpanCorruptedLengths& l = train_->lengths();
    const double s = static_cast<double>(l.inputs), t = static_cast<double>(l.targets);
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
    return Read(*train_, iteration * global_, part, parts);
  }

  std::vector<Metric> Evaluate(bool graph_mode) override {
    const double loss = MeanEvaluationLoss(
        graph_mode, c_.evaluation().eval_iter(), micro_batches_, *eval_step_, model(),
        [this](int64_t batch, int part, int parts) { return Read(*eval_, batch * global_, part, parts); },
        [this](const Graph::Tensors& in) { return Loss(in); });
    return {{"loss", loss}, {"perplexity", std::exp(loss)}};
  }

  std::vector<std::string> MetricNames() const override { return {"loss", "perplexity"}; }

  std::string DataSummary() const override {
    char line[320];
    size_t validation = 0;
    for (const auto& corpus : corpora_) validation += corpus->splits[1].size();
    const zoo::SpanCorruptedLengths& l = train_->lengths();
    const int64_t vocab = train_->options().vocab_size;
    std::snprintf(line, sizeof(line),
                  "vocab %ld; span corruption of %ld tokens: encoder %ld, decoder %ld (%ld spans, sentinels "
                  "%ld..%ld, eos %ld); train ",
                  static_cast<long>(vocab), static_cast<long>(train_->raw_length()),
                  static_cast<long>(l.inputs), static_cast<long>(l.targets), static_cast<long>(l.spans),
                  static_cast<long>(vocab - l.spans), static_cast<long>(vocab - 1),
                  static_cast<long>(train_->options().eos_id));
    return line + train_->Summary(corpora_, 0) + ", validation " + std::to_string(validation) + " documents";
  }

 private:
  // Rows first_sample + FirstRow .. of `data`: the encoder's and decoder's
  // ids on the first stage (the token table is there), the targets on the
  // last.
  Graph::Tensors Read(const zoo::T5Samples& data, int64_t first_sample, int part, int parts) const {
    const BatchLayout layout = BatchLayout::ForWorld(global_);
    const bool needs_inputs = layout.ReadsInputs(), needs_labels = layout.ReadsLabels();
    const int64_t local_rows = layout.LocalRows(parts);
    const int64_t s = data.lengths().inputs, t = data.lengths().targets;
    std::vector<int64_t> inputs, targets;
    if (needs_inputs || needs_labels) {
      const int64_t begin = first_sample + layout.FirstRow(part, parts);
      for (int64_t i = 0; i < local_rows; ++i) {
        const zoo::SpanCorrupted corrupted = data.Sample(begin + i);
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
  std::vector<std::unique_ptr<zoo::Corpus>> corpora_;
  std::unique_ptr<zoo::T5Samples> train_, eval_;
  std::unique_ptr<models::T5> model_;
  std::unique_ptr<Graph> eval_step_;
};
}  // namespace

std::unique_ptr<Task> MakeT5Task(const TaskContext& context) { return std::make_unique<T5Task>(context); }

}  // namespace tessel::train
