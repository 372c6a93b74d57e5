// Several datasets mixed by weight, as Megatron-LM blends `--data-path 0.3
// A 0.7 B`: sample i of the blend is the next unused sample of the dataset
// whose share of samples 0..i lags its weight the most. The greedy choice
// keeps every prefix of the blend within one sample of the weights, and it
// depends on the weights alone, so every rank builds the same blend.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessel::zoo {

class Blend {
 public:
  // The first `size` samples of a blend of datasets with `weights`
  // (positive and finite, any scale; at most 255 datasets). `what` names
  // the blend in errors (the config field). Throws naming the weight, or
  // the index's size if it cannot fit in half the available memory.
  Blend(std::vector<double> weights, int64_t size, const std::string& what);

  int64_t size() const { return static_cast<int64_t>(sample_.size()); }
  int num_datasets() const { return static_cast<int>(counts_.size()); }
  // Sample i of the blend: (dataset, sample of that dataset).
  std::pair<int, int64_t> operator[](int64_t i) const {
    return {dataset_[static_cast<size_t>(i)], sample_[static_cast<size_t>(i)]};
  }
  // How many samples of dataset d the blend takes (what d must hold).
  int64_t count(int d) const { return counts_[static_cast<size_t>(d)]; }

 private:
  std::vector<uint8_t> dataset_;
  std::vector<int64_t> sample_;
  std::vector<int64_t> counts_;
};

}  // namespace tessel::zoo
