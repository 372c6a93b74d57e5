// BERT (models/bert.h) pre-training on a Megatron-format indexed dataset of
// sentences: masked-LM samples of sentence pairs with the sentence-order
// label (zoo/bert_dataset.h). The ids, token types and attention mask go to
// the first stage, the masked-LM labels, their weights and the sentence
// labels to the last.
//
// The loss is the masked-LM cross-entropy averaged over every predicted
// position of the global batch, plus the sentence head's mean
// cross-entropy. Positions per sample vary, so a mean per micro-batch would
// change with the layout and the accumulation; instead each predicted
// position weighs micro-batches / (predicted positions of the global batch),
// which the data tells before the step, and the step's average over
// micro-batches is the one-device value. Evaluation reports the loss, both
// terms and the masked-LM perplexity.
#include <cmath>
#include <cstdio>
#include <memory>

#include "graph/autograd.h"
#include "layers/optimizer.h"
#include "models/bert.h"
#include "ops/functional.h"
#include "tools/train/task.h"
#include "zoo/bert_dataset.h"
#include "zoo/indexed_dataset.h"

namespace tessel::train {
namespace {

zoo::BertSampleOptions SampleOptions(const config::Config& c) {
  const config::DataConfig& d = c.data();
  return {.seq_length = c.model().max_seq_length(),
          .vocab_size = c.model().vocab_size(),
          .masked_lm_prob = d.masked_lm_prob(),
          .short_seq_prob = d.short_seq_prob(),
          .cls_id = d.cls_token_id(),
          .sep_id = d.sep_token_id(),
          .mask_id = d.mask_token_id(),
          .pad_id = d.pad_token_id()};
}

class BertTask : public Task {
 public:
  explicit BertTask(const TaskContext& context)
      : c_(context.config),
        micro_batches_(context.micro_batches),
        corpus_(c_.data().data_prefix()),
        splits_(zoo::SplitDocuments(c_.data().split(), corpus_.num_documents())),
        seq_(c_.model().max_seq_length()),
        global_(c_.train().global_batch_size()) {
    const config::ModelConfig& m = c_.model();
    CheckTokenIds(corpus_, c_);
    CheckValidationDocuments(splits_, corpus_.num_documents(), c_);
    const config::TrainConfig& t = c_.train();
    const zoo::BertSampleOptions options = SampleOptions(c_);
    train_ = std::make_unique<zoo::BertDataset>(corpus_, splits_[0], options, t.train_iter() * global_,
                                                t.seed(), "train");
    if (c_.evaluation().enabled()) {
      eval_ = std::make_unique<zoo::BertDataset>(
          corpus_, splits_[1], options, c_.evaluation().eval_iter() * global_, t.seed() + 1, "validation");
    }
    bert_ = std::make_unique<models::Bert>(
        models::BertConfig{.vocab_size = m.vocab_size(),
                           .hidden = m.hidden_size(),
                           .heads = m.num_attention_heads(),
                           .layers = m.hidden_layers(),
                           .max_seq = m.max_position_embeddings(),
                           .ffn_hidden = m.ffn_hidden_size(),
                           .type_vocab_size = m.type_vocab_size(),
                           .pad_token_id = m.pad_token_id(),
                           .layernorm_epsilon = m.layernorm_epsilon(),
                           .init_std = m.initializer_range(),
                           .seed = t.seed(),
                           .activation = HiddenActivation(m),
                           .embedding_dropout = m.embedding_dropout_prob(),
                           .attention_dropout = m.attention_dropout_prob(),
                           .hidden_dropout = m.hidden_dropout_prob(),
                           .fused_attention = m.fused_attention(),
                           .make_vocab_size_divisible_by = m.make_vocab_size_divisible_by(),
                           .activation_checkpoint = t.activation_checkpoint()});
    eval_step_ = std::make_unique<Graph>(
        "eval_step",
        [this](const Graph::Tensors& in) {
          const models::BertLosses l = Losses(in);
          return Graph::Tensors{
              {"loss", fn::add(l.mlm, l.sentence)}, {"mlm_loss", l.mlm}, {"sentence_loss", l.sentence}};
        },
        context.eval_graph);
  }

  nn::Module& model() override { return *bert_; }
  Tensor Loss(const Graph::Tensors& in) const override {
    const models::BertLosses l = Losses(in);
    return fn::add(l.mlm, l.sentence);
  }
  int64_t tokens_per_sample() const override { return seq_; }
  double TrainFlopsPerSample() const override {
    const config::ModelConfig& m = c_.model();
    const double h = static_cast<double>(m.hidden_size());
    // The masked-LM head (transform and decoder) runs on every position;
    // the pooler and the sentence head once per sample.
    const double per_token = static_cast<double>(m.hidden_layers()) * TransformerLayerFlopsPerToken(m, seq_) +
                             2 * h * h + 2 * h * static_cast<double>(m.vocab_size());
    return 3 * (per_token * static_cast<double>(seq_) + 2 * h * h + 4 * h);
  }
  std::map<std::string, int64_t> PaddedRows() const override {
    const int64_t vocab = c_.model().vocab_size();
    return {{"word_embeddings.weight", vocab}, {"mlm_bias", vocab}};
  }

  Graph::Tensors ReadTrain(int64_t iteration, int part, int parts) const override {
    return Read(*train_, iteration * global_, part, parts);
  }

  std::vector<Metric> Evaluate(bool graph_mode) override {
    double mlm = 0, sentence = 0;
    const int64_t batches = c_.evaluation().eval_iter();
    for (int64_t k = 0; k < batches; ++k) {
      if (graph_mode) {
        const Graph::Tensors out = (*eval_step_)(Read(*eval_, k * global_, 0, 1));
        mlm += optim::ScalarValue(out.at("mlm_loss"));
        sentence += optim::ScalarValue(out.at("sentence_loss"));
        continue;
      }
      NoGradGuard no_grad;
      bert_->Eval();  // no dropout
      for (int part = 0; part < micro_batches_; ++part) {
        const models::BertLosses l = Losses(Read(*eval_, k * global_, part, micro_batches_));
        mlm += optim::ScalarValue(l.mlm) / micro_batches_;
        sentence += optim::ScalarValue(l.sentence) / micro_batches_;
      }
      bert_->Train();
    }
    mlm /= static_cast<double>(batches);
    sentence /= static_cast<double>(batches);
    return {{"loss", mlm + sentence},
            {"mlm_loss", mlm},
            {"sentence_loss", sentence},
            {"mlm_perplexity", std::exp(mlm)}};
  }

  std::vector<std::string> MetricNames() const override {
    return {"loss", "mlm_loss", "sentence_loss", "mlm_perplexity"};
  }

  std::string DataSummary() const override {
    char line[320];
    std::snprintf(
        line, sizeof(line),
        "vocab %ld, sequence %ld, masked_lm_prob %.2f; train %ld sentence-pair samples (%d epochs of "
        "%ld documents of two sentences or more), validation %zu documents",
        static_cast<long>(c_.model().vocab_size()), static_cast<long>(seq_), c_.data().masked_lm_prob(),
        static_cast<long>(train_->size()), train_->epochs(), static_cast<long>(train_->usable_documents()),
        splits_[1].size());
    return line;
  }

 private:
  models::BertLosses Losses(const Graph::Tensors& in) const {
    return bert_->WeightedLosses(in.at("ids"), in.at("token_type_ids"), in.at("attention_mask"),
                                 in.at("mlm_labels"), in.at("mlm_weights"), in.at("sentence_labels"));
  }

  // Rows first_sample + FirstRow .. of `data`.
  Graph::Tensors Read(const zoo::BertDataset& data, int64_t first_sample, int part, int parts) const {
    const BatchLayout layout = BatchLayout::ForWorld(global_);
    const bool needs_inputs = layout.ReadsInputs(), needs_labels = layout.ReadsLabels();
    const int64_t local_rows = layout.LocalRows(parts);
    // Each row's positions [from, to): all of them, or this rank's part of
    // the sequence when the dp ranks split sequences.
    const auto [from, to] = layout.SequenceRange(seq_);
    std::vector<int64_t> ids, types, mlm_labels, sentence_labels;
    std::vector<bool> attend;
    std::vector<float> weights;
    float weight = 0;
    if (needs_labels) {
      // The masked-LM weight: micro-batches / predicted positions of the global batch.
      int64_t predicted = 0;
      for (int64_t i = 0; i < global_; ++i) predicted += data.Predictions((first_sample + i) % data.size());
      weight = predicted > 0 ? static_cast<float>(micro_batches_) / static_cast<float>(predicted) : 0;
    }
    if (needs_inputs || needs_labels) {
      const int64_t begin = first_sample + layout.FirstRow(part, parts);
      for (int64_t i = 0; i < local_rows; ++i) {
        const zoo::BertSample s = data.Sample((begin + i) % data.size());
        if (needs_inputs) {
          ids.insert(ids.end(), s.ids.begin() + from, s.ids.begin() + to);
          types.insert(types.end(), s.token_types.begin() + from, s.token_types.begin() + to);
          attend.insert(attend.end(), s.attention_mask.begin() + from, s.attention_mask.begin() + to);
        }
        if (needs_labels) {
          mlm_labels.insert(mlm_labels.end(), s.mlm_labels.begin() + from, s.mlm_labels.begin() + to);
          for (int64_t i = from; i < to; ++i) weights.push_back(s.mlm_labels[i] == -100 ? 0.0f : weight);
          sentence_labels.push_back(s.sentence_label);
        }
      }
    }
    const int64_t rows = global_ / parts;
    const Shape shape({rows, seq_});
    // A rank outside a placement gives no rows, in the inputs' dtypes (an
    // undefined tensor would read as f32 and change the graph's specs).
    const int64_t first_rows = needs_inputs ? local_rows : 0, last_rows = needs_labels ? local_rows : 0;
    const int64_t part_seq = to - from;
    return {
        {"ids", layout.OnFirst(Tensor::FromVector<int64_t>(ids, {first_rows, part_seq}), shape)},
        {"token_type_ids", layout.OnFirst(Tensor::FromVector<int64_t>(types, {first_rows, part_seq}), shape)},
        {"attention_mask", layout.OnFirst(Tensor::FromVector<bool>(attend, {first_rows, part_seq}), shape)},
        {"mlm_labels", layout.OnLast(Tensor::FromVector<int64_t>(mlm_labels, {last_rows, part_seq}), shape)},
        {"mlm_weights", layout.OnLast(Tensor::FromVector<float>(weights, {last_rows, part_seq}), shape)},
        {"sentence_labels",
         layout.OnLast(Tensor::FromVector<int64_t>(sentence_labels, {last_rows}), Shape({rows}))}};
  }

  const config::Config& c_;
  int micro_batches_;
  zoo::IndexedDataset corpus_;
  std::vector<zoo::DocumentRange> splits_;
  int64_t seq_, global_;
  std::unique_ptr<zoo::BertDataset> train_, eval_;
  std::unique_ptr<models::Bert> bert_;
  std::unique_ptr<Graph> eval_step_;
};

}  // namespace

std::unique_ptr<Task> MakeBertTask(const TaskContext& context) { return std::make_unique<BertTask>(context); }

}  // namespace tessel::train
