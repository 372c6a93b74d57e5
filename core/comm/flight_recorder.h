// The recent collectives of this process, like PyTorch's flight recorder.
//
// Every collective and transfer records (op, group, sequence number on that
// group, bytes, start, end, outcome) in a small ring. On a timeout the
// failing rank prints the ring, and the heartbeat tells the launcher what
// each rank is in, so the rank that diverged can be named.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tessel::comm {

struct CollectiveRecord {
  enum class State { kRunning, kDone, kFailed };
  uint64_t seq = 0;  // per group: the n-th call on that group
  std::string op;
  std::vector<int> group;  // world ranks
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point start, end;
  State state = State::kRunning;
};

class FlightRecorder {
 public:
  static FlightRecorder& Get();
  static constexpr size_t kCapacity = 64;

  // Returns a token for End().
  uint64_t Begin(const std::string& op, const std::vector<int>& group, uint64_t seq, int64_t bytes);
  void End(uint64_t token, bool ok);
  // The newest record (running or finished), if any.
  bool Latest(CollectiveRecord* out) const;
  // One line per record, oldest first, for error messages.
  std::string Dump() const;

 private:
  mutable std::mutex mu_;
  std::vector<CollectiveRecord> ring_;
  uint64_t next_ = 0;  // records ever begun
};

// "0-3", "0,2,4-7": world ranks with runs collapsed.
std::string FormatRanks(const std::vector<int>& ranks);

}  // namespace tessel::comm
