#include "zoo/bert_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"

namespace tessel::zoo {

namespace {

// Draws are written out (not std:: distributions, whose algorithms are left
// to the library) so every rank and platform gets the same samples.
double Uniform(std::mt19937_64* rng) { return static_cast<double>((*rng)() >> 11) * 0x1.0p-53; }
int64_t Below(std::mt19937_64* rng, int64_t n) {
  return static_cast<int64_t>((*rng)() % static_cast<uint64_t>(n));
}

template <typename T>
void Shuffle(std::vector<T>* items, std::mt19937_64* rng) {
  for (size_t i = items->size(); i > 1; --i)
    std::swap((*items)[i - 1], (*items)[static_cast<size_t>(Below(rng, static_cast<int64_t>(i)))]);
}

// The room for A and B: [CLS] A [SEP] B [SEP] in seq_length tokens, or with
// probability short_seq_prob a random length of at least 2.
int64_t TargetTokens(const BertSampleOptions& o, std::mt19937_64* rng) {
  const int64_t room = o.seq_length - 3;
  if (Uniform(rng) < o.short_seq_prob) return 2 + Below(rng, room - 1);
  return room;
}

// Positions predicted in a sample of `length` tokens ([CLS] and two [SEP]
// included, padding not).
int64_t PredictionsFor(int64_t length, double masked_lm_prob) {
  return std::min<int64_t>(length - 3,
                           std::max<int64_t>(1, std::llround(static_cast<double>(length) * masked_lm_prob)));
}

// Sentences longer than this make their document unusable.
int64_t LongestSentence(const BertSampleOptions& o) { return std::max<int64_t>(512, o.seq_length); }

}  // namespace

BertDataset::BertDataset(const IndexedDataset& data, DocumentRange range, const BertSampleOptions& options,
                         int64_t num_samples, uint64_t seed, std::string name)
    : data_(data), options_(options), seed_(seed) {
  const BertSampleOptions& o = options;
  TESSEL_CHECK(o.seq_length >= 5) << "BERT dataset (" << name << "): a sample of " << o.seq_length
                                  << " tokens; expected at least 5 ([CLS] A [SEP] B [SEP])";
  TESSEL_CHECK(o.masked_lm_prob > 0 && o.masked_lm_prob < 1)
      << "BERT dataset (" << name << "): masked_lm_prob " << o.masked_lm_prob << "; expected in (0, 1)";
  TESSEL_CHECK(o.short_seq_prob >= 0 && o.short_seq_prob <= 1)
      << "BERT dataset (" << name << "): short_seq_prob " << o.short_seq_prob << "; expected in [0, 1]";
  TESSEL_CHECK(o.vocab_size > 0) << "BERT dataset (" << name << "): vocab_size " << o.vocab_size;
  TESSEL_CHECK(num_samples >= 0) << "BERT dataset (" << name << "): num_samples " << num_samples;
  TESSEL_CHECK(range.end <= data.num_documents() && range.begin <= range.end)
      << "BERT dataset (" << name << "): documents [" << range.begin << ", " << range.end << ") of "
      << data.num_documents();
  // Usable documents: two sentences or more, none longer than a bound (a
  // document whose "sentences" are whole texts is not split into sentences;
  // skipping it keeps a sample's reads and trimming within a few samples'
  // length).
  const int64_t longest = LongestSentence(o);
  std::vector<size_t> usable;
  int64_t long_sentences = 0;
  for (size_t d = range.begin; d < range.end; ++d) {
    const int64_t begin = data.document_begin(d), end = data.document_end(d);
    bool fits = true;
    for (int64_t s = begin; s < end && fits; ++s)
      fits = data.sequence_length(static_cast<size_t>(s)) <= longest;
    long_sentences += fits ? 0 : 1;
    if (end - begin >= 2 && fits) usable.push_back(d);
  }
  usable_documents_ = static_cast<int64_t>(usable.size());
  TESSEL_CHECK(usable_documents_ > 0)
      << "BERT dataset " << data.prefix() << " (" << name << " split, documents " << range.begin << " to "
      << range.end << "): no document has two sentences of at most " << longest << " tokens ("
      << long_sentences << " hold a longer one); BERT's samples pair sentences (preprocess the text with "
      << "tools/preprocess_data.py --split-sentences) or give the split more documents";
  std::mt19937_64 rng(seed);
  while (size() < num_samples || epochs_ == 0) {
    for (size_t d : usable) {
      const int64_t begin = data.document_begin(d), end = data.document_end(d);
      int64_t first = begin, tokens = 0, target = TargetTokens(o, &rng);
      for (int64_t s = begin; s < end; ++s) {
        tokens += data.sequence_length(static_cast<size_t>(s));
        const int64_t sentences = s + 1 - first, remaining = end - s - 1;
        // Close a chunk once it is long enough, unless that would leave a
        // single sentence behind; the document's end closes the last.
        if ((tokens >= target && remaining > 1 && sentences >= 2) || remaining == 0) {
          if (sentences >= 2) chunks_.push_back({first, s + 1, target});
          first = s + 1;
          tokens = 0;
          target = TargetTokens(o, &rng);
        }
      }
    }
    ++epochs_;
    TESSEL_CHECK(!chunks_.empty()) << "BERT dataset " << data.prefix() << " (" << name
                                   << " split): no sample could be cut";
  }
  Shuffle(&chunks_, &rng);
}

BertSample BertDataset::Sample(int64_t i) const {
  TESSEL_CHECK(i >= 0 && i < size()) << "BERT dataset: sample " << i << " of " << size();
  const BertSampleOptions& o = options_;
  const Chunk& chunk = chunks_[static_cast<size_t>(i)];
  std::seed_seq seeds{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                      static_cast<uint32_t>(i), static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32)};
  std::mt19937_64 rng(seeds);
  // Segments A and B: the chunk's sentences cut after a random one.
  const int64_t sentences = chunk.end_sentence - chunk.first_sentence;
  const int64_t cut = chunk.first_sentence + 1 + Below(&rng, sentences - 1);
  Segment a{chunk.first_sentence, cut}, b{cut, chunk.end_sentence};
  for (Segment* segment : {&a, &b})
    for (int64_t s = segment->first_sentence; s < segment->end_sentence; ++s)
      segment->end += data_.sequence_length(static_cast<size_t>(s));
  BertSample out;
  if (Uniform(&rng) < 0.5) {
    std::swap(a, b);
    out.sentence_label = 1;
  }
  // Trim the longer segment, front or back at random, until both fit; each
  // keeps at least one token (the target is at least 2). Only lengths move
  // here: the kept tokens alone are read below.
  while (a.size() + b.size() > chunk.target_tokens) {
    Segment& longer = a.size() > b.size() ? a : b;
    if (Uniform(&rng) < 0.5)
      ++longer.begin;
    else
      --longer.end;
  }
  std::vector<int64_t>& ids = out.ids;
  ids.push_back(o.cls_id);
  ReadSegment(a, &ids);
  ids.push_back(o.sep_id);
  const size_t first_b = ids.size();
  ReadSegment(b, &ids);
  ids.push_back(o.sep_id);
  const size_t length = ids.size();
  out.token_types.assign(length, 0);
  std::fill(out.token_types.begin() + static_cast<std::ptrdiff_t>(first_b), out.token_types.end(), 1);
  out.attention_mask.assign(length, 1);
  out.mlm_labels.assign(length, -100);
  // Masking: positions of A and B, shuffled; the first k are predicted.
  std::vector<int64_t> candidates;
  for (size_t p = 1; p + 1 < length; ++p)
    if (p != first_b - 1) candidates.push_back(static_cast<int64_t>(p));
  Shuffle(&candidates, &rng);
  const int64_t k = PredictionsFor(static_cast<int64_t>(length), o.masked_lm_prob);
  for (int64_t j = 0; j < k; ++j) {
    const size_t p = static_cast<size_t>(candidates[static_cast<size_t>(j)]);
    out.mlm_labels[p] = ids[p];
    const double u = Uniform(&rng);
    if (u < 0.8)
      ids[p] = o.mask_id;
    else if (u >= 0.9)
      ids[p] = Below(&rng, o.vocab_size);
  }
  out.predictions = k;
  ids.resize(static_cast<size_t>(o.seq_length), o.pad_id);
  out.token_types.resize(ids.size(), 0);
  out.attention_mask.resize(ids.size(), 0);
  out.mlm_labels.resize(ids.size(), -100);
  return out;
}

void BertDataset::ReadSegment(const Segment& segment, std::vector<int64_t>* out) const {
  int64_t position = 0;  // of the sentence's first token in the segment
  for (int64_t s = segment.first_sentence; s < segment.end_sentence; ++s) {
    const int64_t length = data_.sequence_length(static_cast<size_t>(s));
    const int64_t from = std::max(segment.begin, position), to = std::min(segment.end, position + length);
    if (from < to) data_.Read(static_cast<size_t>(s), from - position, to - from, out);
    position += length;
  }
}

int64_t BertDataset::Predictions(int64_t i) const {
  TESSEL_CHECK(i >= 0 && i < size()) << "BERT dataset: sample " << i << " of " << size();
  const Chunk& chunk = chunks_[static_cast<size_t>(i)];
  int64_t tokens = 0;
  for (int64_t s = chunk.first_sentence; s < chunk.end_sentence; ++s)
    tokens += data_.sequence_length(static_cast<size_t>(s));
  return PredictionsFor(std::min(tokens, chunk.target_tokens) + 3, options_.masked_lm_prob);
}

}  // namespace tessel::zoo
