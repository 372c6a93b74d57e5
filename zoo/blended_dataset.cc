#include "zoo/blended_dataset.h"

#include <cmath>

#include "core/error.h"
#include "zoo/gpt_dataset.h"

namespace tessel::zoo {

Blend::Blend(std::vector<double> weights, int64_t size, const std::string& what) {
  TESSEL_CHECK(!weights.empty() && weights.size() <= 255)
      << what << ": " << weights.size() << " datasets; expected 1 to 255";
  double total = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    TESSEL_CHECK(std::isfinite(weights[d]) && weights[d] > 0)
        << what << "[" << d << "].weight is " << weights[d] << "; expected a positive number";
    total += weights[d];
  }
  TESSEL_CHECK(std::isfinite(total)) << what << ": the weights sum to " << total;
  for (double& w : weights) w /= total;
  // Nine bytes a sample (its dataset and its index there).
  const int64_t available = AvailableMemoryBytes();
  TESSEL_CHECK(size >= 0 && static_cast<double>(size) * 9 <= static_cast<double>(available) / 2)
      << what << ": a blend of " << size << " samples needs an index of "
      << static_cast<double>(size) * 9 / (1 << 30) << " GiB; this machine has "
      << static_cast<double>(available) / (1 << 30)
      << " GiB available (at most half of it for the index): train for fewer iterations or smaller batches";
  counts_.assign(weights.size(), 0);
  dataset_.reserve(static_cast<size_t>(size));
  sample_.reserve(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    // The dataset furthest behind its share of the first i + 1 samples
    // (the lowest index on a tie).
    size_t best = 0;
    double best_lag = -1e300;
    for (size_t d = 0; d < weights.size(); ++d) {
      const double lag = weights[d] * static_cast<double>(i + 1) - static_cast<double>(counts_[d]);
      if (lag > best_lag) best = d, best_lag = lag;
    }
    dataset_.push_back(static_cast<uint8_t>(best));
    sample_.push_back(counts_[best]++);
  }
}

}  // namespace tessel::zoo
