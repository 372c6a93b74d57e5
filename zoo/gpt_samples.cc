#include "zoo/gpt_samples.h"

namespace tessel::zoo {

std::vector<std::unique_ptr<Corpus>> OpenCorpora(const config::DataConfig& data, std::vector<double>* weights) {
  std::vector<std::unique_ptr<Corpus>> corpora;
  weights->clear();
  if (data.blend_size() == 0) {
    corpora.push_back(std::make_unique<Corpus>(data.data_prefix(), data.split()));
    return corpora;
  }
  for (const config::WeightedDataset& part : data.blend()) {
    corpora.push_back(std::make_unique<Corpus>(part.data_prefix(), data.split()));
    weights->push_back(part.weight());
  }
  return corpora;
}

GPTSamples::GPTSamples(const std::vector<std::unique_ptr<Corpus>>& corpora, const std::vector<double>& weights,
                       int split, int64_t seq, int64_t num_samples, uint64_t seed, const std::string& name) {
  if (corpora.size() == 1) {
    parts_.push_back(
        std::make_unique<GPTDataset>(corpora[0]->data, corpora[0]->splits[split], seq, num_samples, seed, name));
    return;
  }
  blend_ = std::make_unique<Blend>(weights, num_samples, "data.blend");
  for (size_t d = 0; d < corpora.size(); ++d)
    parts_.push_back(std::make_unique<GPTDataset>(corpora[d]->data, corpora[d]->splits[split], seq,
                                                  blend_->count(static_cast<int>(d)), seed + 1000 * d, name));
}

int64_t GPTSamples::size() const { return blend_ ? blend_->size() : parts_[0]->size(); }

void GPTSamples::Sample(int64_t i, std::vector<int64_t>* out) const {
  if (!blend_) return parts_[0]->Sample(i % parts_[0]->size(), out);
  const auto [d, j] = (*blend_)[i % blend_->size()];
  parts_[static_cast<size_t>(d)]->Sample(j % parts_[static_cast<size_t>(d)]->size(), out);
}

std::string GPTSamples::Summary(const std::vector<std::unique_ptr<Corpus>>& corpora, int split) const {
  std::string text = std::to_string(size()) + " samples";
  for (size_t d = 0; d < parts_.size(); ++d) {
    text += d == 0 ? " (" : "; ";
    if (blend_)
      text += std::to_string(blend_->count(static_cast<int>(d))) + " from " + corpora[d]->data.prefix() + ", ";
    text += std::to_string(parts_[d]->epochs()) + " epochs of " +
            std::to_string(corpora[d]->splits[static_cast<size_t>(split)].size()) + " documents";
  }
  return text + ")";
}

}  // namespace tessel::zoo
