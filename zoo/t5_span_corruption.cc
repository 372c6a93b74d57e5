#include "zoo/t5_span_corruption.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace tessel::zoo {

namespace {
// `items` split into `segments` non-empty runs at random: the run lengths.
std::vector<int64_t> RandomSegmentation(int64_t items, int64_t segments, std::mt19937_64* rng) {
  // A run starts after each of segments - 1 of the items - 1 gaps, chosen
  // by a Fisher-Yates shuffle of the gap markers.
  std::vector<char> starts(static_cast<size_t>(items - 1), 0);
  for (int64_t i = 0; i < segments - 1; ++i) starts[static_cast<size_t>(i)] = 1;
  for (size_t i = starts.size(); i > 1; --i) std::swap(starts[i - 1], starts[(*rng)() % i]);
  std::vector<int64_t> lengths(static_cast<size_t>(segments), 0);
  size_t run = 0;
  lengths[0] = 1;
  for (char start : starts) {
    if (start) ++run;
    ++lengths[run];
  }
  return lengths;
}
}  // namespace

SpanCorruptedLengths SpanCorruptionLengths(int64_t length, const SpanCorruptionOptions& o) {
  TESSEL_CHECK(o.noise_density > 0 && o.noise_density < 1 && o.mean_span_length >= 1 && length >= 2)
      << "span corruption: noise_density " << o.noise_density << ", mean_span_length " << o.mean_span_length
      << " and length " << length << "; expected 0 < density < 1, a mean span of 1 or more, 2 or more tokens";
  SpanCorruptedLengths l{};
  l.noise_tokens = static_cast<int64_t>(std::llround(static_cast<double>(length) * o.noise_density));
  l.noise_tokens = std::min(std::max<int64_t>(l.noise_tokens, 1), length - 1);
  l.spans = std::max<int64_t>(
      static_cast<int64_t>(std::llround(static_cast<double>(l.noise_tokens) / o.mean_span_length)), 1);
  // Each span needs a kept run before it (kept and noise runs alternate).
  TESSEL_CHECK(l.spans <= length - l.noise_tokens)
      << "span corruption: " << length << " tokens at noise_density " << o.noise_density
      << " and mean_span_length " << o.mean_span_length << " give " << l.spans << " spans but only "
      << length - l.noise_tokens << " kept tokens to separate them; expected a lower density or longer spans";
  l.inputs = length - l.noise_tokens + l.spans + 1;
  l.targets = l.noise_tokens + l.spans + 1;
  return l;
}

int64_t SpanCorruptionRawLength(int64_t inputs_length, const SpanCorruptionOptions& o) {
  TESSEL_CHECK(inputs_length >= 3) << "span corruption: an encoder length of " << inputs_length
                                   << " tokens; expected 3 or more (a kept token, a sentinel and eos)";
  // As Hugging Face's compute_input_and_target_lengths: grow the raw length
  // while its corrupted inputs still fit.
  int64_t length = 2;
  while (SpanCorruptionLengths(length + 1, o).inputs <= inputs_length) ++length;
  TESSEL_CHECK(SpanCorruptionLengths(length, o).inputs <= inputs_length)
      << "span corruption: no sequence corrupts to at most " << inputs_length << " tokens";
  return length;
}

SpanCorrupted CorruptSpans(const std::vector<int64_t>& tokens, const SpanCorruptionOptions& o,
                           uint64_t seed) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  const SpanCorruptedLengths l = SpanCorruptionLengths(length, o);
  TESSEL_CHECK(l.spans <= o.vocab_size / 2)
      << "span corruption: " << l.spans << " spans need as many sentinel ids at the end of a vocabulary of "
      << o.vocab_size;
  const int64_t lowest_sentinel = o.vocab_size - l.spans;
  for (int64_t t : tokens)
    TESSEL_CHECK(t >= 0 && t < lowest_sentinel)
        << "span corruption: token " << t << " is outside the vocabulary below its sentinels (ids "
        << lowest_sentinel << " .. " << o.vocab_size - 1 << " mark the " << l.spans << " spans)";
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> noise = RandomSegmentation(l.noise_tokens, l.spans, &rng);
  const std::vector<int64_t> kept = RandomSegmentation(length - l.noise_tokens, l.spans, &rng);
  SpanCorrupted out;
  out.inputs.reserve(static_cast<size_t>(l.inputs));
  out.targets.reserve(static_cast<size_t>(l.targets));
  size_t next = 0;
  // Kept and noise runs alternate, a kept run first.
  for (int64_t span = 0; span < l.spans; ++span) {
    for (int64_t i = 0; i < kept[static_cast<size_t>(span)]; ++i) out.inputs.push_back(tokens[next++]);
    const int64_t sentinel = o.vocab_size - 1 - span;
    out.inputs.push_back(sentinel);
    out.targets.push_back(sentinel);
    for (int64_t i = 0; i < noise[static_cast<size_t>(span)]; ++i) out.targets.push_back(tokens[next++]);
  }
  out.inputs.push_back(o.eos_id);
  out.targets.push_back(o.eos_id);
  return out;
}

}  // namespace tessel::zoo
