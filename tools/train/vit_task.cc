// ViT (models/vit.h) on an image dataset (zoo/image_dataset.h: a
// safetensors file of images and labels, or synthetic images): the samples
// split into train / validation / test by data.split after a seeded
// shuffle; training reads the train split in a new seeded order each epoch;
// evaluation covers the validation split (or evaluation.eval_iter batches
// of it) and reports the loss and top-1 accuracy over exactly its images
// (a last, partial batch is padded with rows labelled -100, which count in
// neither).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>

#include "graph/autograd.h"
#include "layers/optimizer.h"
#include "models/vit.h"
#include "tools/train/task.h"
#include "zoo/image_dataset.h"

namespace tessel::train {
namespace {

zoo::ImageDataset OpenImages(const config::Config& c) {
  const std::string& source = c.data().image_dataset();
  const config::ModelConfig& m = c.model();
  if (source == "synthetic")
    return zoo::ImageDataset::Synthetic(c.data().synthetic_samples(), m.num_channels(), m.image_size(),
                                        m.num_classes(), c.train().seed() + 7);
  return zoo::ImageDataset::Load(source);
}

class ViTTask : public Task {
 public:
  explicit ViTTask(const TaskContext& context)
      : c_(context.config),
        micro_batches_(context.micro_batches),
        images_(OpenImages(c_)),
        global_(c_.train().global_batch_size()) {
    config::ModelConfig m = c_.model();
    // The data decides what the model sees; a config that disagrees is named.
    TESSEL_CHECK(images_.channels() == m.num_channels() && images_.height() == m.image_size() &&
                 images_.width() == m.image_size())
        << "tessel-train: " << images_.name() << " holds images of " << images_.channels() << " x "
        << images_.height() << " x " << images_.width() << " but the model expects model.num_channels "
        << m.num_channels() << " x model.image_size " << m.image_size() << " x " << m.image_size();
    TESSEL_CHECK(m.num_classes() == 0 || m.num_classes() >= images_.num_classes())
        << "tessel-train: " << images_.name() << " has " << images_.num_classes()
        << " classes but model.num_classes is " << m.num_classes() << "; expected at least as many (or 0)";
    num_classes_ = m.num_classes() > 0 ? m.num_classes() : images_.num_classes();
    const config::TrainConfig& t = c_.train();
    splits_ = zoo::SplitSamples(c_.data().split(), images_.size(), t.seed());
    TESSEL_CHECK(!splits_[0].empty()) << "tessel-train: data.split '" << c_.data().split()
                                      << "' leaves no training images of " << images_.size();
    TESSEL_CHECK(!c_.evaluation().enabled() || !splits_[1].empty())
        << "tessel-train: data.split '" << c_.data().split() << "' gives the validation split none of "
        << images_.size() << " images; give it a share or set evaluation.enabled false";
    vit_ =
        std::make_unique<models::ViT>(models::ViTConfig{.image_size = m.image_size(),
                                                        .patch_size = m.patch_size(),
                                                        .num_channels = m.num_channels(),
                                                        .num_classes = num_classes_,
                                                        .hidden = m.hidden_size(),
                                                        .heads = m.num_attention_heads(),
                                                        .layers = m.hidden_layers(),
                                                        .ffn_hidden = m.ffn_hidden_size(),
                                                        .layernorm_epsilon = m.layernorm_epsilon(),
                                                        .init_std = m.initializer_range(),
                                                        .seed = t.seed(),
                                                        .activation = HiddenActivation(m),
                                                        .embedding_dropout = m.embedding_dropout_prob(),
                                                        .attention_dropout = m.attention_dropout_prob(),
                                                        .hidden_dropout = m.hidden_dropout_prob(),
                                                        .fused_attention = m.fused_attention(),
                                                        .activation_checkpoint = t.activation_checkpoint()});
    eval_step_ = std::make_unique<Graph>(
        "eval_step",
        [this](const Graph::Tensors& in) {
          auto [loss_sum, correct] = vit_->LossSumAndCorrect(in.at("images"), in.at("labels"));
          return Graph::Tensors{{"loss_sum", loss_sum}, {"correct", correct}};
        },
        context.eval_graph);
  }

  nn::Module& model() override { return *vit_; }
  Tensor Loss(const Graph::Tensors& in) const override {
    return vit_->Loss(in.at("images"), in.at("labels"));
  }
  int64_t tokens_per_sample() const override { return vit_->num_patches() + 1; }
  double TrainFlopsPerSample() const override {
    const config::ModelConfig& m = c_.model();
    const double h = static_cast<double>(m.hidden_size()), patches = static_cast<double>(vit_->num_patches());
    const double patch_pixels = static_cast<double>(m.patch_size() * m.patch_size() * m.num_channels());
    const double forward = (patches + 1) * static_cast<double>(m.hidden_layers()) *
                               TransformerLayerFlopsPerToken(m, vit_->num_patches() + 1) +
                           patches * 2 * patch_pixels * h + 2 * h * static_cast<double>(num_classes_);
    return 3 * forward;
  }

  Graph::Tensors ReadTrain(int64_t iteration, int part, int parts) const override {
    // Sample k of the run is position k % n of epoch k / n's order.
    const std::vector<int64_t>& train = splits_[0];
    const int64_t n = static_cast<int64_t>(train.size());
    return Read(
        [&](int64_t row) {
          const int64_t k = iteration * global_ + row;
          return train[EpochOrder(k / n)[k % n]];
        },
        part, parts);
  }

  std::vector<Metric> Evaluate(bool graph_mode) override {
    const std::vector<int64_t>& val = splits_[1];
    const int64_t n = static_cast<int64_t>(val.size());
    const int64_t whole = (n + global_ - 1) / global_;
    const int64_t batches =
        c_.evaluation().eval_iter() > 0 ? std::min(c_.evaluation().eval_iter(), whole) : whole;
    double loss_sum = 0, correct = 0;
    for (int64_t k = 0; k < batches; ++k) {
      auto sample = [&](int64_t row) { return k * global_ + row < n ? val[k * global_ + row] : -1; };
      if (graph_mode) {
        // Results of a batch come back averaged over its micro-batches.
        const Graph::Tensors out = (*eval_step_)(Read(sample, 0, 1));
        loss_sum += optim::ScalarValue(out.at("loss_sum")) * micro_batches_;
        correct += optim::ScalarValue(out.at("correct")) * micro_batches_;
        continue;
      }
      NoGradGuard no_grad;
      vit_->Eval();
      for (int part = 0; part < micro_batches_; ++part) {
        const Graph::Tensors in = Read(sample, part, micro_batches_);
        auto [l, right] = vit_->LossSumAndCorrect(in.at("images"), in.at("labels"));
        loss_sum += optim::ScalarValue(l);
        correct += optim::ScalarValue(right);
      }
      vit_->Train();
    }
    const double counted = static_cast<double>(std::min(n, batches * global_));
    return {{"loss", loss_sum / counted}, {"accuracy", correct / counted}};
  }

  std::vector<std::string> MetricNames() const override { return {"loss", "accuracy"}; }

  std::string DataSummary() const override {
    char line[320];
    std::snprintf(line, sizeof(line),
                  "%s: %ld images of %ld x %ld x %ld in %ld classes; train %zu, validation %zu images",
                  images_.name().c_str(), static_cast<long>(images_.size()),
                  static_cast<long>(images_.channels()), static_cast<long>(images_.height()),
                  static_cast<long>(images_.width()), static_cast<long>(num_classes_), splits_[0].size(),
                  splits_[1].size());
    return line;
  }

 private:
  // The training split's order in `epoch`: a permutation drawn from the
  // seed and the epoch (cached: consecutive batches share an epoch).
  const std::vector<int64_t>& EpochOrder(int64_t epoch) const {
    if (epoch != order_epoch_) {
      order_.resize(splits_[0].size());
      std::iota(order_.begin(), order_.end(), 0);
      std::mt19937_64 rng(c_.train().seed() * 1000003 + static_cast<uint64_t>(epoch));
      for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i)
        std::swap(order_[i], order_[rng() % static_cast<uint64_t>(i + 1)]);
      order_epoch_ = epoch;
    }
    return order_;
  }

  // This rank's rows of a batch whose row r is image sample(r) (-1: a
  // padding row, zeros labelled -100): images on the first stage, labels
  // on the last.
  template <typename SampleOf>
  Graph::Tensors Read(SampleOf sample, int part, int parts) const {
    const BatchLayout layout = BatchLayout::ForWorld(global_);
    const int64_t local_rows = layout.LocalRows(parts), numel = images_.image_numel();
    const int64_t ch = images_.channels(), h = images_.height(), w = images_.width();
    std::vector<float> pixels;
    std::vector<int64_t> labels;
    if (layout.ReadsInputs()) pixels.assign(static_cast<size_t>(local_rows * numel), 0.0f);
    for (int64_t i = 0; i < local_rows && (layout.ReadsInputs() || layout.ReadsLabels()); ++i) {
      const int64_t s = sample(layout.FirstRow(part, parts) + i);
      if (layout.ReadsInputs() && s >= 0) images_.Image(s, pixels.data() + i * numel);
      if (layout.ReadsLabels()) labels.push_back(s >= 0 ? images_.Label(s) : -100);
    }
    const int64_t rows = global_ / parts;
    return {{"images",
             layout.OnFirst(layout.ReadsInputs() ? Tensor::FromVector<float>(pixels, {local_rows, ch, h, w})
                                                 : Tensor::FromVector<float>({}, {0, ch, h, w}),
                            Shape({rows, ch, h, w}))},
            {"labels", layout.OnLast(layout.ReadsLabels() ? Tensor::FromVector<int64_t>(labels, {local_rows})
                                                          : Tensor::FromVector<int64_t>({}, {0}),
                                     Shape({rows}))}};
  }

  const config::Config& c_;
  int micro_batches_;
  zoo::ImageDataset images_;
  int64_t global_;
  int64_t num_classes_ = 0;
  std::vector<std::vector<int64_t>> splits_;
  std::unique_ptr<models::ViT> vit_;
  std::unique_ptr<Graph> eval_step_;
  mutable std::vector<int64_t> order_;
  mutable int64_t order_epoch_ = -1;
};

}  // namespace

std::unique_ptr<Task> MakeViTTask(const TaskContext& context) { return std::make_unique<ViTTask>(context); }

}  // namespace tessel::train
