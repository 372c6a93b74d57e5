// Causal language models — GPT-2 (models/gpt.h), Llama (models/llama.h) and
// those a program registers (train::RegisterCausalLM) — on a Megatron-format
// indexed dataset, or a blend of several by weight
// (zoo/blended_dataset.h): samples of max_seq_length + 1 tokens
// (zoo/gpt_dataset.h), ids in and the next tokens as labels; evaluation
// reports the loss and perplexity.
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "layers/dist.h"
#include "ops/functional.h"
#include "tools/train/model_config.h"
#include "tools/train/model_registry.h"
#include "tools/train/task.h"
#include "zoo/gpt_samples.h"
#include "zoo/indexed_dataset.h"

namespace tessel::train {
namespace {

using zoo::Corpus;
using zoo::GPTSamples;

class CausalLMTask : public Task {
 public:
  CausalLMTask(const TaskContext& context, const CausalLMFactory& build)
      : c_(context.config),
        micro_batches_(context.micro_batches),
        seq_(c_.model().max_seq_length()),
        global_(c_.train().global_batch_size()) {
    const config::DataConfig& data = c_.data();
    // (ResolveConfig asks the zoo's models for token data, and leaves a
    // registered model's data to it.)
    TESSEL_CHECK(!data.data_prefix().empty() || data.blend_size() > 0)
        << "config: data.data_prefix is not set; model.arch '" << c_.model().arch()
        << "' trains on token data: expected the path prefix of an indexed dataset (<prefix>.bin and "
           "<prefix>.idx), or data.blend";
    std::vector<double> weights;
    corpora_ = zoo::OpenCorpora(data, &weights);
    for (const auto& corpus : corpora_) {
      CheckTokenIds(corpus->data, c_);
      CheckValidationDocuments(corpus->splits, corpus->data.num_documents(), c_);
    }
    const config::TrainConfig& t = c_.train();
    train_ =
        std::make_unique<GPTSamples>(corpora_, weights, 0, seq_, t.train_iter() * global_, t.seed(), "train");
    if (c_.evaluation().enabled()) {
      eval_ = std::make_unique<GPTSamples>(corpora_, weights, 1, seq_, c_.evaluation().eval_iter() * global_,
                                           t.seed() + 1, "validation");
    }
    lm_ = build(c_);
    TESSEL_CHECK(lm_.module != nullptr && lm_.loss != nullptr)
        << "model.arch '" << c_.model().arch() << "': its factory gave no module or no loss";
    TESSEL_CHECK(std::isfinite(lm_.forward_flops_per_token) && lm_.forward_flops_per_token > 0)
        << "model.arch '" << c_.model().arch() << "': its factory gave forward_flops_per_token "
        << lm_.forward_flops_per_token
        << "; expected the forward pass's FLOPs per token (2 per multiply-add), for TFLOP/s and MFU";
    // Evaluation runs forward only (context.eval_graph).
    eval_step_ = std::make_unique<Graph>(
        "eval_step",
        [this](const Graph::Tensors& in) {
          return Graph::Tensors{{"loss", Loss(in)}};
        },
        context.eval_graph);
  }

  nn::Module& model() override { return *lm_.module; }
  Tensor Loss(const Graph::Tensors& in) const override { return lm_.loss(in.at("ids"), in.at("labels")); }
  int64_t tokens_per_sample() const override { return seq_; }
  double TrainFlopsPerSample() const override {
    return 3 * lm_.forward_flops_per_token * static_cast<double>(seq_);
  }
  std::vector<std::string> MetricNames() const override { return {"loss", "perplexity"}; }
  std::map<std::string, int64_t> PaddedRows() const override { return lm_.padded_rows; }

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

  std::string DataSummary() const override {
    char line[256];
    size_t validation = 0;
    for (const auto& corpus : corpora_) validation += corpus->splits[1].size();
    std::snprintf(line, sizeof(line), "vocab %ld, sequence %ld; train ",
                  static_cast<long>(c_.model().vocab_size()), static_cast<long>(seq_));
    return line + train_->Summary(corpora_, 0) + ", validation " + std::to_string(validation) + " documents";
  }

 private:
  // Rows first_sample + FirstRow .. of `data`: ids on the first stage,
  // labels on the last.
  Graph::Tensors Read(const GPTSamples& data, int64_t first_sample, int part, int parts) const {
    const BatchLayout layout = BatchLayout::ForWorld(global_);
    const bool needs_ids = layout.ReadsInputs(), needs_labels = layout.ReadsLabels();
    const int64_t local_rows = layout.LocalRows(parts);
    // Each row's positions [from, to): all of them, or this rank's part of
    // the sequence under all-to-all sequence parallelism.
    const auto [from, to] = layout.SequenceRange(seq_);
    std::vector<int64_t> ids, labels, tokens;
    if (needs_ids || needs_labels) {
      const int64_t begin = first_sample + layout.FirstRow(part, parts);
      for (int64_t i = 0; i < local_rows; ++i) {
        tokens.clear();
        data.Sample((begin + i) % data.size(), &tokens);
        ids.insert(ids.end(), tokens.begin() + from, tokens.begin() + to);
        labels.insert(labels.end(), tokens.begin() + from + 1, tokens.begin() + to + 1);
      }
    }
    const Shape shape({global_ / parts, seq_});
    // A rank outside a placement gives no rows, but in the inputs' dtype
    // (an undefined tensor would read as f32 and change the graph's specs).
    const Tensor none = Tensor::FromVector<int64_t>({}, {0, seq_});
    return {{"ids", layout.OnFirst(
                        needs_ids ? Tensor::FromVector<int64_t>(ids, {local_rows, to - from}) : none, shape)},
            {"labels",
             layout.OnLast(needs_labels ? Tensor::FromVector<int64_t>(labels, {local_rows, to - from}) : none,
                           shape)}};
  }

  const config::Config& c_;
  int micro_batches_;
  std::vector<std::unique_ptr<Corpus>> corpora_;
  int64_t seq_, global_;
  std::unique_ptr<GPTSamples> train_, eval_;
  CausalLM lm_;
  std::unique_ptr<Graph> eval_step_;
};

}  // namespace

std::unique_ptr<Task> MakeCausalLMTask(const TaskContext& context, const CausalLMFactory& build) {
  return std::make_unique<CausalLMTask>(context, build);
}

}  // namespace tessel::train
