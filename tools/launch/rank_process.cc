#include "tools/launch/rank_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace tessel::launch {

namespace {
// Writes to the launcher's stdout/stderr. When the reader has gone (EPIPE:
// `tessel-launch ... | head`), the rest of that stream is dropped and the
// job goes on; SIGPIPE is ignored by the launcher.
void WriteAll(int fd, const std::string& s) {
  if (fd == STDOUT_FILENO && RankProcess::stdout_closed()) return;
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      pollfd pfd{fd, POLLOUT, 0};
      ::poll(&pfd, 1, 100);
      continue;
    }
    if (n <= 0) {
      if (fd == STDOUT_FILENO && errno == EPIPE) {
        RankProcess::stdout_closed() = true;
        static const char msg[] =
            "tessel-launch: standard output was closed by its reader; the ranks' output is dropped from now "
            "on\n";
        [[maybe_unused]] ssize_t m = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
      }
      return;
    }
    done += static_cast<size_t>(n);
  }
}
}  // namespace

bool& RankProcess::stdout_closed() {
  static bool closed = false;
  return closed;
}

RankProcess::RankProcess(int rank, const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env)
    : rank_(rank) {
  int out[2], err[2], hb[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hb) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    // Child: own process group, die with the launcher, wire up the pipes.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::fcntl(hb[1], F_SETFD, 0);  // the heartbeat end survives exec
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::setenv("TESSEL_LAUNCHER_FD", std::to_string(hb[1]).c_str(), 1);
    ::signal(SIGPIPE, SIG_DFL);  // the launcher ignores it; programs expect the default
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "tessel-launch: cannot execute '%s': %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid_, pid_);  // also from the parent, so Signal() works at once
  ::close(out[1]);
  ::close(err[1]);
  ::close(hb[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  hb_fd_ = hb[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(err_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(hb_fd_, F_SETFL, O_NONBLOCK);
}

void RankProcess::ReadHeartbeats() {
  char buf[16384];
  while (hb_fd_ >= 0) {
    ssize_t n = ::read(hb_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {
      ::close(hb_fd_);
      hb_fd_ = -1;
      break;
    }
    hb_pending_.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = hb_pending_.find('\n', start)) != std::string::npos) {
      auto parsed = comm::ParseHeartbeat(std::string_view(hb_pending_).substr(start, nl - start));
      if (parsed && parsed->rank == rank_) {
        heartbeat_ = std::move(parsed);
        last_heartbeat_ = Clock::now();
      } else {
        ++malformed_heartbeats_;
      }
      start = nl + 1;
    }
    hb_pending_.erase(0, start);
    if (hb_pending_.size() > comm::kMaxHeartbeatLine) {  // no newline in sight: not a heartbeat
      ++malformed_heartbeats_;
      hb_pending_.clear();
    }
  }
}

void RankProcess::Emit(std::string& pending, bool to_stderr, bool flush_tail) {
  std::string prefix = "[rank " + std::to_string(rank_) + "] ";
  std::string lines;
  size_t start = 0, nl;
  while ((nl = pending.find('\n', start)) != std::string::npos) {
    lines += prefix + pending.substr(start, nl - start + 1);
    start = nl + 1;
  }
  pending.erase(0, start);
  if (flush_tail && !pending.empty()) {
    lines += prefix + pending + "\n";
    pending.clear();
  }
  if (!lines.empty()) WriteAll(to_stderr ? STDERR_FILENO : STDOUT_FILENO, lines);
}

void RankProcess::Pump(int fd) {
  bool is_err = fd == err_fd_;
  std::string& pending = is_err ? err_pending_ : out_pending_;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      pending.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n == 0 || (n < 0 && errno != EAGAIN)) {  // EOF or error: this pipe is done
      Emit(pending, is_err, /*flush_tail=*/true);
      ::close(fd);
      (is_err ? err_fd_ : out_fd_) = -1;
      return;
    }
    break;  // EAGAIN: nothing more for now
  }
  Emit(pending, is_err, /*flush_tail=*/false);
}

void RankProcess::ClosePipes() {
  for (int fd : {out_fd_, err_fd_}) {
    if (fd >= 0) Pump(fd);
  }
  Emit(out_pending_, false, true);
  Emit(err_pending_, true, true);
  for (int* fd : {&out_fd_, &err_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void RankProcess::Signal(int sig) const {
  if (pid_ > 0) ::kill(-pid_, sig);
}

void RankProcess::SetExited(int wait_status) {
  running_ = false;
  exited_at_ = Clock::now();
  if (hb_fd_ >= 0) {
    ReadHeartbeats();  // the last words (e.g. phase=done)
    if (hb_fd_ >= 0) ::close(hb_fd_);
    hb_fd_ = -1;
  }
  wait_status_ = wait_status;
}

bool RankProcess::failed() const {
  return !running_ && !(WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0);
}

std::string RankProcess::DescribeExit() const {
  if (running_) return "is still running";
  if (WIFEXITED(wait_status_)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    int sig = WTERMSIG(wait_status_);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(wait_status_);
}

}  // namespace tessel::launch
