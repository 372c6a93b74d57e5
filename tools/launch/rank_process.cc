#include "tools/launch/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace tessel::launch {

namespace {
void WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}
}  // namespace

RankProcess::RankProcess(int rank, const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env)
    : rank_(rank) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
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
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
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
  out_fd_ = out[0];
  err_fd_ = err[0];
  ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
  ::fcntl(err_fd_, F_SETFL, O_NONBLOCK);
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
