#include "zoo/gpt_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>

#include "core/error.h"

namespace tessel::zoo {

namespace {
// Fisher-Yates with a 64-bit Mersenne twister: the same order on every rank
// and every platform (std::shuffle's is left to the library).
void Shuffle(std::vector<int64_t>* items, std::mt19937_64* rng) {
  for (size_t i = items->size(); i > 1; --i) std::swap((*items)[i - 1], (*items)[(*rng)() % i]);
}
}  // namespace

std::vector<DocumentRange> SplitDocuments(const std::string& split, size_t num_documents) {
  std::vector<double> parts;
  std::stringstream in(split);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double value = -1;
    try {
      value = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TESSEL_CHECK(used == item.size() && !item.empty() && value >= 0 && std::isfinite(value))
        << "data.split '" << split << "': '" << item
        << "' is not a non-negative number; expected proportions "
        << "of train, validation and test like 98,2,0";
    parts.push_back(value);
  }
  double total = 0;
  for (double p : parts) total += p;
  TESSEL_CHECK(!parts.empty() && parts.size() <= 3 && total > 0)
      << "data.split '" << split << "': expected 1 to 3 proportions with a positive sum, like 98,2,0";
  parts.resize(3, 0.0);
  std::vector<DocumentRange> ranges;
  size_t begin = 0;
  double cumulative = 0;
  for (double p : parts) {
    cumulative += p / total;
    const size_t end = std::min(num_documents, static_cast<size_t>(std::llround(cumulative * num_documents)));
    ranges.push_back({begin, std::max(begin, end)});
    begin = ranges.back().end;
  }
  ranges.back().end = num_documents;
  return ranges;
}

int64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 62;
}

GPTDataset::GPTDataset(const IndexedDataset& data, DocumentRange range, int64_t seq_length,
                       int64_t num_samples, uint64_t seed, std::string name)
    : data_(data), seq_length_(seq_length) {
  TESSEL_CHECK(seq_length >= 1 && num_samples >= 0)
      << "GPT dataset (" << name << "): seq_length " << seq_length << ", num_samples " << num_samples;
  TESSEL_CHECK(range.end <= data.num_documents() && range.begin <= range.end)
      << "GPT dataset (" << name << "): documents [" << range.begin << ", " << range.end << ") of "
      << data.num_documents();
  std::vector<int64_t> split_sequences;
  int64_t tokens_per_epoch = 0;
  for (int64_t i = data.document_begin(range.begin); i < data.document_begin(range.end); ++i) {
    split_sequences.push_back(i);
    tokens_per_epoch += data.sequence_length(static_cast<size_t>(i));
  }
  TESSEL_CHECK(tokens_per_epoch > seq_length)
      << "GPT dataset " << data.prefix() << " (" << name << " split, documents " << range.begin << " to "
      << range.end << "): " << tokens_per_epoch << " tokens; a sample needs " << seq_length + 1
      << " (max_seq_length + 1): give the split more documents or shorten the sequences";
  // Epochs until the stream holds num_samples samples: e·T tokens hold
  // (e·T - 1) / s of them, so e = ceil((num_samples·s + 1) / T), at least 1
  // (in 128 bits: a count from a config may be anything).
  const __int128 needed_tokens = static_cast<__int128>(num_samples) * seq_length + 1;
  const __int128 epochs = std::max<__int128>(1, (needed_tokens + tokens_per_epoch - 1) / tokens_per_epoch);
  // The index lists every epoch's sequences (two i64 each) and every
  // sample (one i64): refused before it is built if it cannot fit.
  const __int128 index_bytes =
      epochs * static_cast<__int128>(split_sequences.size()) * 16 + static_cast<__int128>(num_samples) * 8;
  const int64_t available = AvailableMemoryBytes();
  TESSEL_CHECK(epochs <= std::numeric_limits<int>::max() && index_bytes <= available / 2)
      << "GPT dataset " << data.prefix() << " (" << name << " split): " << num_samples << " samples of "
      << seq_length << " tokens need " << static_cast<double>(epochs) << " epochs of its " << tokens_per_epoch
      << " tokens, an index of " << static_cast<double>(index_bytes) / (1 << 30) << " GiB; this machine has "
      << static_cast<double>(available) / (1 << 30)
      << " GiB available (at most half of it for the index): train for fewer iterations "
         "(train.train_iter) or smaller batches (train.global_batch_size), or give the split more data";
  epochs_ = static_cast<int>(epochs);
  std::mt19937_64 rng(seed);
  int64_t position = 0;
  for (int e = 0; e < epochs_; ++e) {
    std::vector<int64_t> order = split_sequences;
    Shuffle(&order, &rng);
    for (int64_t i : order) {
      sequences_.push_back(i);
      starts_.push_back(position);
      position += data.sequence_length(static_cast<size_t>(i));
    }
  }
  starts_.push_back(position);
  shuffle_.resize(static_cast<size_t>((position - 1) / seq_length));
  for (size_t j = 0; j < shuffle_.size(); ++j) shuffle_[j] = static_cast<int64_t>(j);
  Shuffle(&shuffle_, &rng);
}

void GPTDataset::Sample(int64_t i, std::vector<int64_t>* out) const {
  TESSEL_CHECK(i >= 0 && i < size()) << "GPT dataset: sample " << i << " of " << size();
  int64_t position = shuffle_[static_cast<size_t>(i)] * seq_length_;
  int64_t needed = seq_length_ + 1;
  // The sequence holding `position`: the last start at or before it.
  size_t k =
      static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), position) - starts_.begin()) - 1;
  while (needed > 0) {
    const size_t sequence = static_cast<size_t>(sequences_[k]);
    const int64_t offset = position - starts_[k];
    const int64_t count = std::min(needed, data_.sequence_length(sequence) - offset);
    data_.Read(sequence, offset, count, out);
    needed -= count;
    position += count;
    ++k;
  }
}

}  // namespace tessel::zoo
