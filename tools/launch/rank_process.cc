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

#include "tools/launch/output_writer.h"

namespace tessel::launch {

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
    hb_stream_.Append(std::string_view(buf, static_cast<size_t>(n)),
                      [&](std::optional<comm::Heartbeat> parsed) {
                        if (parsed && parsed->rank == rank_) {
                          heartbeat_ = std::move(parsed);
                          last_heartbeat_ = Clock::now();
                        } else {
                          ++malformed_heartbeats_;
                        }
                      });
  }
}

namespace {
// <what> of a line "tessel: fatal error on rank N: <what>", or nullopt.
std::optional<std::string_view> FatalErrorOf(std::string_view line) {
  constexpr std::string_view kPrefix = "tessel: fatal error on rank ";
  if (line.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  size_t i = kPrefix.size();
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') ++i;
  if (i == kPrefix.size() || line.substr(i, 2) != ": ") return std::nullopt;
  return line.substr(i + 2);
}
}  // namespace

void RankProcess::Emit(std::string& pending, bool to_stderr, bool flush_tail) {
  const std::string prefix = "[rank " + std::to_string(rank_) + "] ";
  std::string lines;
  size_t start = 0;
  while (start < pending.size()) {
    const size_t nl = pending.find('\n', start);
    if (nl != std::string::npos && nl - start < kMaxLineBytes) {
      const std::string_view line(pending.data() + start, nl - start);
      const auto fatal = FatalErrorOf(line);
      if (fatal && fatal_error_.empty()) fatal_error_ = std::string(*fatal);
      // Said already by another rank: the launcher's summary names this one.
      const bool repeated = fatal && fatal_errors_printed_ && !fatal_errors_printed_->emplace(*fatal).second;
      if (!repeated) lines.append(prefix).append(pending, start, nl - start + 1);
      start = nl + 1;
    } else if (pending.size() - start >= kMaxLineBytes) {
      // A line this long is passed on in pieces, each marked, never held whole.
      lines.append(prefix).append(pending, start, kMaxLineBytes).append(" [line cut: continues]\n");
      start += kMaxLineBytes;
    } else {
      break;
    }
  }
  pending.erase(0, start);
  if (flush_tail && !pending.empty()) {
    lines += prefix + pending + "\n";
    pending.clear();
  }
  if (!lines.empty()) Output().Write(to_stderr ? STDERR_FILENO : STDOUT_FILENO, std::move(lines));
}

void RankProcess::Drain() {
  for (int fd : {out_fd_, err_fd_})
    for (int calls = 0; fd >= 0 && calls < 16; ++calls)
      if (Pump(fd)) break;  // all read (or the pipe closed)
}

bool RankProcess::Pump(int fd) {
  bool is_err = fd == err_fd_;
  std::string& pending = is_err ? err_pending_ : out_pending_;
  char buf[65536];
  // A bounded read per call: a rank that prints without pause must not
  // keep the launcher from its other ranks, its heartbeats and its clock.
  for (int reads = 0; reads < 4; ++reads) {
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
      return true;
    }
    Emit(pending, is_err, /*flush_tail=*/false);
    return true;  // EAGAIN: nothing more for now
  }
  Emit(pending, is_err, /*flush_tail=*/false);
  return false;
}

void RankProcess::ClosePipes() {
  // What the rank left in its pipes (at most a pipe's buffer each, unless a
  // grandchild still writes: bounded here).
  for (int fd : {out_fd_, err_fd_}) {
    for (int calls = 0; fd >= 0 && calls < 64 && !Pump(fd); ++calls) {
    }
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
