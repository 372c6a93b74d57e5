// One rank's child process as tessel-launch sees it: its pid, the pipes that
// carry its stdout and stderr, and the partial lines read from them so far.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace tessel::launch {

class RankProcess {
 public:
  // Forks and execs argv with `env` added to the inherited environment, in a
  // process group of its own (so stopping it stops whatever it spawned).
  RankProcess(int rank, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env);

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  bool running() const { return running_; }
  bool pipes_open() const { return out_fd_ >= 0 || err_fd_ >= 0; }

  // Reads what is available on `fd` and writes whole lines, prefixed with
  // "[rank N] ", to the launcher's stdout or stderr.
  void Pump(int fd);
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
};

}  // namespace tessel::launch
