// The per-step communication trace: every collective and transfer this
// process issues (op, group, bytes), recorded only while tracing is on, so
// a test or a user can check that a step communicates what the model needs
// and nothing more (e.g. Megatron's two all-reduces per transformer layer).
//
//   CommTrace::Get().Start();  ... one step ...  auto calls = CommTrace::Get().Take();
//   std::cout << CommTrace::Summarize(calls);
//
// The flag --comm_trace (TESSEL_COMM_TRACE=1) of the example programs prints
// the summary of every step.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tessel::comm {

struct CommCall {
  std::string op;          // "all_reduce", "all_gather", "send", ...
  std::vector<int> group;  // world ranks (for send/recv: this rank and the peer)
  int64_t bytes = 0;       // payload this rank contributes (sent for send, received for recv)
};

class CommTrace {
 public:
  static CommTrace& Get();
  // Clears the trace and starts recording.
  void Start();
  void Stop() { enabled_.store(false, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Called by communicators for every call; a no-op unless recording.
  void Record(const char* op, const std::vector<int>& group, int64_t bytes);
  // The calls since Start() or the last Take(); recording continues.
  std::vector<CommCall> Take();

  // One line per (op, group): "all_reduce [0-1] x4 1024 B" in first-seen
  // order, then a total line.
  static std::string Summarize(const std::vector<CommCall>& calls);

 private:
  std::atomic<bool> enabled_{false};
  std::mutex mu_;
  std::vector<CommCall> calls_;
};

}  // namespace tessel::comm
