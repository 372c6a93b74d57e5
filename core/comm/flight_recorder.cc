#include "core/comm/flight_recorder.h"

#include <sstream>

namespace tessel::comm {

FlightRecorder& FlightRecorder::Get() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: used until exit
  return *recorder;
}

uint64_t FlightRecorder::Begin(const std::string& op, const std::vector<int>& group, uint64_t seq,
                               int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  CollectiveRecord r;
  r.seq = seq;
  r.op = op;
  r.group = group;
  r.bytes = bytes;
  r.start = std::chrono::steady_clock::now();
  uint64_t token = next_++;
  if (ring_.size() < kCapacity) {
    ring_.push_back(std::move(r));
  } else {
    ring_[token % kCapacity] = std::move(r);
  }
  return token;
}

void FlightRecorder::End(uint64_t token, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (token + kCapacity < next_) return;  // overwritten already
  CollectiveRecord& r = ring_[token % kCapacity];
  r.end = std::chrono::steady_clock::now();
  r.state = ok ? CollectiveRecord::State::kDone : CollectiveRecord::State::kFailed;
}

bool FlightRecorder::Latest(CollectiveRecord* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (next_ == 0) return false;
  // The latest still running wins: a finished send after a hung collective
  // must not hide it.
  for (uint64_t i = next_; i-- > 0 && i + kCapacity >= next_;) {
    if (ring_[i % kCapacity].state == CollectiveRecord::State::kRunning) {
      *out = ring_[i % kCapacity];
      return true;
    }
  }
  *out = ring_[(next_ - 1) % kCapacity];
  return true;
}

std::string FlightRecorder::Dump() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  auto now = std::chrono::steady_clock::now();
  uint64_t first = next_ > kCapacity ? next_ - kCapacity : 0;
  os << "recent collectives of this rank (oldest first; #n = n-th call on that group):";
  for (uint64_t i = first; i < next_; ++i) {
    const CollectiveRecord& r = ring_[i % kCapacity];
    auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    os << "\n  " << r.op << " #" << r.seq << " on group [" << FormatRanks(r.group) << "], " << r.bytes
       << " bytes, ";
    switch (r.state) {
      case CollectiveRecord::State::kRunning:
        os << "RUNNING for " << ms(now - r.start) << " ms";
        break;
      case CollectiveRecord::State::kDone:
        os << "done in " << ms(r.end - r.start) << " ms";
        break;
      case CollectiveRecord::State::kFailed:
        os << "FAILED after " << ms(r.end - r.start) << " ms";
        break;
    }
  }
  if (next_ == 0) os << " none";
  return os.str();
}

std::string FormatRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    os << (i ? "," : "") << ranks[i];
    if (j > i) os << "-" << ranks[j];
    i = j + 1;
  }
  return os.str();
}

}  // namespace tessel::comm
