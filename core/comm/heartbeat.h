// Heartbeats from ranks to their launcher.
//
// tessel-launch gives each rank one end of a socket pair (its descriptor in
// TESSEL_LAUNCHER_FD). tessel::Init starts a thread that writes one line
// per second when the rank's state changed, and at least every 5 s:
//
//   tessel-hb 1 rank=3 phase=run state=in op=all_reduce group=0-3 seq=7 bytes=4 age_ms=2100
//
// A rank that falls silent (stopped, hung in the kernel) is named by the
// launcher; the state tells what it last ran, and comparing ranks' states
// names the one that skipped a collective the others wait in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::comm {

struct Heartbeat {
  int rank = -1;
  std::string phase = "init";  // init (rendezvous) | run | done (reached shutdown)
  bool in_op = false;          // inside `op` now (else: `op` is the last one)
  std::string op;              // empty: no collective yet
  std::vector<int> group;      // world ranks of op's group
  uint64_t seq = 0;
  int64_t bytes = 0;
  int64_t age_ms = 0;  // since op started (in_op) or ended
};

inline constexpr size_t kMaxHeartbeatLine = 8192;
inline constexpr size_t kMaxHeartbeatGroup = 1 << 16;

// One line, '\n'-terminated. A group too long for a line is left out.
std::string FormatHeartbeat(const Heartbeat& hb);
// Strict: nullopt for anything that is not a well-formed line (bounded
// length, known fields, numbers in range, group of at most
// kMaxHeartbeatGroup ranks). `line` excludes the '\n'.
std::optional<Heartbeat> ParseHeartbeat(std::string_view line);
// The launcher's side of the stream: bytes as they arrive (any split),
// cut into lines and parsed. A line past kMaxHeartbeatLine without a newline
// is dropped as malformed, so the buffer stays bounded.
class HeartbeatStream {
 public:
  // Calls `on_line` with each complete line's parse (nullopt: malformed).
  template <typename OnLine>
  void Append(std::string_view bytes, OnLine&& on_line) {
    pending_.append(bytes);
    size_t start = 0, nl;
    while ((nl = pending_.find('\n', start)) != std::string::npos) {
      on_line(ParseHeartbeat(std::string_view(pending_).substr(start, nl - start)));
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (pending_.size() > kMaxHeartbeatLine) {  // no newline in sight: not a heartbeat
      on_line(std::optional<Heartbeat>());
      pending_.clear();
    }
  }

 private:
  std::string pending_;
};

// "in all_reduce #7 on group [0-3] (4 bytes) for 2.1 s".
std::string DescribeHeartbeat(const Heartbeat& hb);
// Same op, group and sequence number: the same collective call.
bool SameCollective(const Heartbeat& a, const Heartbeat& b);

// Rank side: starts the heartbeat thread if TESSEL_LAUNCHER_FD is set.
void StartHeartbeat(int rank);
// Sends phase=`phase` at once (e.g. "done" at shutdown).
void SendHeartbeatNow(const std::string& phase);

}  // namespace tessel::comm
