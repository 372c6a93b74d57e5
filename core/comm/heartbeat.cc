#include "core/comm/heartbeat.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/comm/flight_recorder.h"

namespace tessel::comm {

namespace {
template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return !text.empty() && ec == std::errc() && ptr == text.data() + text.size();
}

bool ParseRanks(std::string_view text, std::vector<int>* out) {
  out->clear();
  if (text.empty()) return true;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string_view part =
        text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start);
    size_t dash = part.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!ParseNumber(part, &lo)) return false;
      hi = lo;
    } else if (!ParseNumber(part.substr(0, dash), &lo) || !ParseNumber(part.substr(dash + 1), &hi)) {
      return false;
    }
    if (lo < 0 || hi < lo || static_cast<size_t>(hi - lo) + out->size() >= kMaxHeartbeatGroup) return false;
    // A 64-bit counter: `r <= hi` with an int would never end for hi = INT_MAX.
    for (int64_t r = lo; r <= hi; ++r) out->push_back(static_cast<int>(r));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return true;
}

bool ValidToken(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}
}  // namespace

std::string FormatHeartbeat(const Heartbeat& hb) {
  std::ostringstream os;
  os << "tessel-hb 1 rank=" << hb.rank << " phase=" << hb.phase << " state=" << (hb.in_op ? "in" : "idle");
  if (!hb.op.empty()) {
    std::string group = FormatRanks(hb.group);
    os << " op=" << hb.op;
    if (group.size() < kMaxHeartbeatLine / 2) os << " group=" << group;
    os << " seq=" << hb.seq << " bytes=" << hb.bytes;
  }
  os << " age_ms=" << hb.age_ms << "\n";
  return os.str();
}

std::optional<Heartbeat> ParseHeartbeat(std::string_view line) {
  if (line.size() > kMaxHeartbeatLine || line.substr(0, 12) != "tessel-hb 1 ") return std::nullopt;
  Heartbeat hb;
  bool has_rank = false, has_state = false;
  size_t start = 12;
  while (start < line.size()) {
    size_t space = line.find(' ', start);
    std::string_view field =
        line.substr(start, space == std::string_view::npos ? line.size() - start : space - start);
    start = space == std::string_view::npos ? line.size() : space + 1;
    size_t eq = field.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "rank") {
      if (!ParseNumber(value, &hb.rank) || hb.rank < 0) return std::nullopt;
      has_rank = true;
    } else if (key == "phase") {
      if (value != "init" && value != "run" && value != "done") return std::nullopt;
      hb.phase = std::string(value);
    } else if (key == "state") {
      if (value != "in" && value != "idle") return std::nullopt;
      hb.in_op = value == "in";
      has_state = true;
    } else if (key == "op") {
      if (!ValidToken(value)) return std::nullopt;
      hb.op = std::string(value);
    } else if (key == "group") {
      if (!ParseRanks(value, &hb.group)) return std::nullopt;
    } else if (key == "seq") {
      if (!ParseNumber(value, &hb.seq)) return std::nullopt;
    } else if (key == "bytes") {
      if (!ParseNumber(value, &hb.bytes) || hb.bytes < 0) return std::nullopt;
    } else if (key == "age_ms") {
      if (!ParseNumber(value, &hb.age_ms) || hb.age_ms < 0) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  // Group, sequence and bytes describe an op: without one they are not
  // a heartbeat tessel writes.
  bool op_fields =
      !hb.group.empty() || hb.seq != 0 || hb.bytes != 0 || line.find(" seq=") != std::string_view::npos;
  if (!has_rank || !has_state || (hb.op.empty() && (hb.in_op || op_fields))) return std::nullopt;
  return hb;
}

std::string DescribeHeartbeat(const Heartbeat& hb) {
  std::ostringstream os;
  if (hb.phase == "done") {
    os << "finished (reached shutdown)";
    if (!hb.op.empty())
      os << "; its last collective was " << hb.op << " #" << hb.seq << " on group [" << FormatRanks(hb.group)
         << "]";
    return os.str();
  }
  if (hb.op.empty()) return hb.phase == "init" ? "in rendezvous" : "running, no collective yet";
  os << (hb.in_op ? "in " : "between collectives; the last was ") << hb.op << " #" << hb.seq << " on group ["
     << FormatRanks(hb.group) << "] (" << hb.bytes << " bytes) " << (hb.in_op ? "for " : "ended ")
     << hb.age_ms / 1000.0 << " s" << (hb.in_op ? "" : " ago");
  return os.str();
}

bool SameCollective(const Heartbeat& a, const Heartbeat& b) {
  return a.op == b.op && a.group == b.group && a.seq == b.seq;
}

namespace {
struct HeartbeatState {
  int fd = -1;
  int rank = -1;
  std::mutex mu;  // serialises writes
  std::string phase = "init";
};
HeartbeatState* g_hb = nullptr;

Heartbeat Snapshot(const std::string& phase) {
  Heartbeat hb;
  hb.rank = g_hb->rank;
  hb.phase = phase;
  CollectiveRecord r;
  if (FlightRecorder::Get().Latest(&r)) {
    auto now = std::chrono::steady_clock::now();
    hb.in_op = r.state == CollectiveRecord::State::kRunning;
    hb.op = r.op;
    hb.group = r.group;
    hb.seq = r.seq;
    hb.bytes = r.bytes;
    hb.age_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - (hb.in_op ? r.start : r.end)).count();
  }
  return hb;
}

void Send(const std::string& line) {
  // Non-blocking and without SIGPIPE: a busy or departed launcher must not
  // stall or kill the rank.
  [[maybe_unused]] ssize_t n = ::send(g_hb->fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}
}  // namespace

void StartHeartbeat(int rank) {
  const char* fd_text = std::getenv("TESSEL_LAUNCHER_FD");
  int fd = -1;
  if (g_hb != nullptr || fd_text == nullptr || !ParseNumber(std::string_view(fd_text), &fd) || fd < 3) return;
  if (::fcntl(fd, F_GETFD) < 0) return;  // not open here (the variable was inherited by a grandchild)
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);      // programs this rank starts do not inherit it
  g_hb = new HeartbeatState();           // lives until exit, as the thread does
  g_hb->fd = fd;
  g_hb->rank = rank;
  std::thread([] {
    std::string last;
    auto last_sent = std::chrono::steady_clock::now() - std::chrono::hours(1);
    while (true) {
      std::string phase;
      {
        std::lock_guard<std::mutex> lock(g_hb->mu);
        phase = g_hb->phase;
      }
      Heartbeat hb = Snapshot(phase);
      Heartbeat key = hb;
      key.age_ms = 0;
      std::string now_key = FormatHeartbeat(key);
      auto now = std::chrono::steady_clock::now();
      if (now_key != last || now - last_sent >= std::chrono::seconds(5)) {
        std::lock_guard<std::mutex> lock(g_hb->mu);
        Send(FormatHeartbeat(hb));
        last = now_key;
        last_sent = now;
      }
      // The launcher holds the other end for the job's whole life: a hangup
      // means it is gone (SIGKILLed, say), and the rank's processes go with
      // it, even those a wrapper script started, which its death signal
      // does not reach.
      pollfd pfd{g_hb->fd, POLLRDHUP, 0};
      const int ready = ::poll(&pfd, 1, 1000);
      if (ready > 0 && (pfd.revents & (POLLHUP | POLLRDHUP | POLLERR)) == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(1));  // anything else: not ours to read
      } else if (ready > 0) {
        std::fprintf(stderr,
                     "tessel: rank %d: tessel-launch is gone (its heartbeat socket closed); ending this "
                     "rank's processes\n",
                     g_hb->rank);
        ::kill(0, SIGKILL);  // this process group: the rank as the launcher started it
        ::_exit(1);
      }
    }
  }).detach();
}

void SendHeartbeatNow(const std::string& phase) {
  if (g_hb == nullptr) return;
  std::lock_guard<std::mutex> lock(g_hb->mu);
  g_hb->phase = phase;
  Send(FormatHeartbeat(Snapshot(phase)));
}

}  // namespace tessel::comm
