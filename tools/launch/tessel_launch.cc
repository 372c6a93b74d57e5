// tessel-launch: starts one process per rank with torchrun-style variables,
// prefixes their output with the rank, and stops the whole job as soon as
// one rank fails, naming it.
//
//   tessel-launch --nproc_per_node 4 -- ./my_program --flag value
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tools/launch/rank_process.h"

DEFINE_int32(nproc_per_node, 1, "Processes (ranks) to start on this node");
DEFINE_int32(nnodes, 1, "Number of nodes in the job");
DEFINE_int32(node_rank, 0, "This node's index, 0 <= node_rank < nnodes");
DEFINE_string(master_addr, "127.0.0.1", "Host of global rank 0, which serves the rendezvous store");
DEFINE_int32(master_port, 29500, "Port of the rendezvous store; 0 picks a free port (single node only)");
DEFINE_int32(kill_grace_s, 5, "After a rank fails, seconds the others get after SIGTERM before SIGKILL");
DEFINE_int32(max_run_s, 0, "Stop the whole job after this many seconds (0: no limit)");

namespace {

using Clock = std::chrono::steady_clock;
using tessel::launch::RankProcess;

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "tessel-launch: error: %s\n", message.c_str());
  std::exit(2);
}

void CheckFlags(int argc) {
  if (FLAGS_nproc_per_node < 1 || FLAGS_nproc_per_node > 4096) {
    Fail("--nproc_per_node=" + std::to_string(FLAGS_nproc_per_node) + " is invalid; expected 1..4096");
  }
  if (FLAGS_nnodes < 1) Fail("--nnodes=" + std::to_string(FLAGS_nnodes) + " is invalid; expected >= 1");
  if (FLAGS_node_rank < 0 || FLAGS_node_rank >= FLAGS_nnodes) {
    Fail("--node_rank=" + std::to_string(FLAGS_node_rank) +
         " is invalid; expected 0 <= node_rank < nnodes=" + std::to_string(FLAGS_nnodes));
  }
  if (FLAGS_master_port < 0 || FLAGS_master_port > 65535) {
    Fail("--master_port=" + std::to_string(FLAGS_master_port) + " is invalid; expected 0..65535");
  }
  if (FLAGS_master_port == 0 && FLAGS_nnodes > 1) {
    Fail("--master_port=0 (any free port) only works on one node; give every node the same port");
  }
  if (FLAGS_master_addr.empty()) Fail("--master_addr is empty; expected the host of global rank 0");
  if (FLAGS_kill_grace_s < 0) Fail("--kill_grace_s must be >= 0");
  if (FLAGS_max_run_s < 0) Fail("--max_run_s must be >= 0");
  if (argc < 2) Fail("no program given; usage: tessel-launch [flags] -- PROGRAM [ARGS...]");
}

// Fails early, with the name, if the program cannot be found or run.
void CheckProgram(const std::string& program) {
  auto runnable = [](const std::string& path) { return ::access(path.c_str(), X_OK) == 0; };
  if (program.find('/') != std::string::npos) {
    if (!runnable(program)) Fail("program '" + program + "' does not exist or is not executable");
    return;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (runnable((dir.empty() ? "." : dir) + "/" + program)) return;
    start = end + 1;
  }
  Fail("program '" + program + "' was not found on PATH");
}

int PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Fail(std::string("cannot find a free port: ") + std::strerror(errno));
  }
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// Reaps every child that has exited; returns the first newly failed rank or -1.
int ReapChildren(std::vector<std::unique_ptr<RankProcess>>& ranks) {
  int first_failed = -1;
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (auto& r : ranks) {
      if (r->pid() != pid) continue;
      r->SetExited(status);
      if (r->failed() && first_failed < 0) first_failed = r->rank();
    }
  }
  return first_failed;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "start one process per rank for a tessel job\n"
      "usage: tessel-launch [flags] -- PROGRAM [ARGS...]\n\n"
      "Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "MASTER_ADDR and MASTER_PORT; its output lines are prefixed with [rank N]. When a\n"
      "rank exits non-zero or is killed, the others are stopped (SIGTERM, then SIGKILL\n"
      "after --kill_grace_s) and tessel-launch exits 1 naming the rank.");
  gflags::SetVersionString("0.1.0");
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  CheckFlags(argc);
  std::vector<std::string> program(argv + 1, argv + argc);
  CheckProgram(program[0]);

  const int world = FLAGS_nproc_per_node * FLAGS_nnodes;
  const int port = FLAGS_master_port == 0 ? PickFreePort() : FLAGS_master_port;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int local = 0; local < FLAGS_nproc_per_node; ++local) {
    int rank = FLAGS_node_rank * FLAGS_nproc_per_node + local;
    std::map<std::string, std::string> env = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(local)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_WORLD_SIZE", std::to_string(FLAGS_nproc_per_node)},
        {"GROUP_RANK", std::to_string(FLAGS_node_rank)},
        {"MASTER_ADDR", FLAGS_master_addr},
        {"MASTER_PORT", std::to_string(port)},
    };
    ranks.push_back(std::make_unique<RankProcess>(rank, program, env));
  }

  const auto start = Clock::now();
  int failed_rank = -1;     // the rank whose failure stopped the job
  std::string stop_reason;  // why the launcher stopped the job, if it did
  Clock::time_point kill_at{};
  bool stopping = false;

  auto stop_all = [&](const std::string& reason) {
    stopping = true;
    stop_reason = reason;
    std::fprintf(stderr, "tessel-launch: %s; stopping the other ranks\n", reason.c_str());
    for (auto& r : ranks) {
      if (r->running()) r->Signal(SIGTERM);
    }
    kill_at = Clock::now() + std::chrono::seconds(FLAGS_kill_grace_s);
  };

  Clock::time_point all_exited_at{};
  while (true) {
    std::vector<pollfd> fds;
    std::vector<RankProcess*> owners;
    for (auto& r : ranks) {
      for (int fd : {r->stdout_fd(), r->stderr_fd()}) {
        if (fd >= 0) {
          fds.push_back({fd, POLLIN, 0});
          owners.push_back(r.get());
        }
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) owners[i]->Pump(fds[i].fd);
    }

    int newly_failed = ReapChildren(ranks);
    if (newly_failed >= 0 && !stopping) {
      failed_rank = newly_failed;
      const auto& r = *ranks[newly_failed - FLAGS_node_rank * FLAGS_nproc_per_node];
      stop_all("rank " + std::to_string(failed_rank) + " (pid " + std::to_string(r.pid()) + ") " +
               r.DescribeExit());
    }
    if (g_signal != 0 && !stopping) {
      stop_all(std::string("received ") + ::strsignal(g_signal));
    }
    if (FLAGS_max_run_s > 0 && !stopping && Clock::now() - start > std::chrono::seconds(FLAGS_max_run_s)) {
      stop_all("the job ran past --max_run_s=" + std::to_string(FLAGS_max_run_s));
    }
    if (stopping && Clock::now() >= kill_at) {
      for (auto& r : ranks) {
        if (r->running()) r->Signal(SIGKILL);
      }
    }

    bool any_running = false, any_pipe = false;
    for (auto& r : ranks) {
      any_running |= r->running();
      any_pipe |= r->pipes_open();
    }
    if (!any_running) {
      // Grandchildren may hold a pipe open; give them a moment, then stop reading.
      if (all_exited_at == Clock::time_point{}) all_exited_at = Clock::now();
      if (!any_pipe || Clock::now() - all_exited_at > std::chrono::seconds(1)) break;
    }
  }
  for (auto& r : ranks) r->ClosePipes();

  if (stopping) {
    std::fprintf(stderr, "tessel-launch: job failed: %s\n", stop_reason.c_str());
    for (auto& r : ranks) {
      if (r->rank() != failed_rank) {
        std::fprintf(stderr, "tessel-launch:   rank %d %s\n", r->rank(), r->DescribeExit().c_str());
      }
    }
    if (g_signal != 0 && failed_rank < 0) return 128 + g_signal;
    if (FLAGS_max_run_s > 0 && failed_rank < 0) return 124;
    return 1;
  }
  return 0;
}
