// One rank's child process as tessel-launch sees it: its pid, the pipes that
// carry its stdout and stderr, and the partial lines read from them so far.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/comm/heartbeat.h"

namespace tessel::launch {

class RankProcess {
 public:
  using Clock = std::chrono::steady_clock;
  // Forks and execs argv with `env` added to the inherited environment, in a
  // process group of its own (so stopping it stops whatever it spawned). The
  // child gets one end of a socket pair for heartbeats (TESSEL_LAUNCHER_FD).
  RankProcess(int rank, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  bool running() const { return running_; }
  bool pipes_open() const { return out_fd_ >= 0 || err_fd_ >= 0; }
  int heartbeat_fd() const { return hb_fd_; }

  // Reads heartbeat lines; malformed ones are counted and ignored.
  void ReadHeartbeats();
  // The latest heartbeat and when it came (nullopt before the first).
  const std::optional<comm::Heartbeat>& heartbeat() const { return heartbeat_; }
  Clock::time_point last_heartbeat() const { return last_heartbeat_; }
  int64_t malformed_heartbeats() const { return malformed_heartbeats_; }
  // Set while the child is stopped by a signal (waitpid WUNTRACED).
  void SetStopped(int sig, Clock::time_point at) { stopped_sig_ = sig, stopped_at_ = at; }
  void SetContinued() { stopped_sig_ = 0; }
  int stopped_signal() const { return stopped_sig_; }
  Clock::time_point stopped_at() const { return stopped_at_; }
  Clock::time_point exited_at() const { return exited_at_; }
  // Longer lines are passed on in marked pieces of this size.
  static constexpr size_t kMaxLineBytes = 64 << 10;

  // Reads what is available on `fd` (a bounded amount per call) and queues
  // whole lines, prefixed with "[rank N] ", for the launcher's stdout or
  // stderr (tools/launch/output_writer.h: never blocks; a reader that went
  // away, e.g. `| head`, or one that stopped reading, loses output, not the
  // job). Returns whether it read all there was (EAGAIN or end of file).
  bool Pump(int fd);
  // Reads what the rank left in its pipes after it exited (bounded: a
  // grandchild holding them open may go on writing).
  void Drain();
  // The set of fatal errors printed so far, shared by a launcher's ranks: a
  // rank's "tessel: fatal error on rank N: <what>" line is passed on only if
  // no rank printed the same <what> before (a config mistake every rank
  // finds is said once). Not owned; may be null (every line passed on).
  void ShareFatalErrors(std::set<std::string>* printed) { fatal_errors_printed_ = printed; }
  // The first fatal error the rank printed (<what>), or "".
  const std::string& fatal_error() const { return fatal_error_; }
  // Writes any unterminated tail and closes both pipes.
  void ClosePipes();
  // Sends `sig` to the rank's whole process group.
  void Signal(int sig) const;
  // Records the wait() status after the child was reaped.
  void SetExited(int wait_status);
  int wait_status() const { return wait_status_; }
  bool failed() const;
  // "exited with status 3" / "was killed by signal 9 (Killed)".
  std::string DescribeExit() const;

 private:
  void Emit(std::string& pending, bool to_stderr, bool flush_tail);

  int rank_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool running_ = true;
  int wait_status_ = 0;
  std::string out_pending_;
  std::string err_pending_;
  int hb_fd_ = -1;
  comm::HeartbeatStream hb_stream_;
  std::optional<comm::Heartbeat> heartbeat_;
  Clock::time_point last_heartbeat_{};
  int64_t malformed_heartbeats_ = 0;
  int stopped_sig_ = 0;
  Clock::time_point stopped_at_{};
  Clock::time_point exited_at_{};
  std::set<std::string>* fatal_errors_printed_ = nullptr;
  std::string fatal_error_;
};

}  // namespace tessel::launch
