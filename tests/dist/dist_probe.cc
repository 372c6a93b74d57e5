// A small program for the launcher and rendezvous failure tests: it plays a
// rank that behaves (or misbehaves) as --mode says.
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/comm/process_group.h"
#include "core/init.h"

DEFINE_string(mode, "allreduce",
              "allreduce: join, all-reduce once, exit 0 | sleep: join, print ready, sleep | "
              "skip_init: --odd_rank never joins | hang_collective: --odd_rank skips the all-reduce");
DEFINE_int32(odd_rank, -1, "The rank that misbehaves in skip_init and hang_collective");
DEFINE_bool(ignore_sigterm, false, "Ignore SIGTERM, so only SIGKILL stops this process");

int main(int argc, char** argv) {
  // Parse flags first (Init parsing the remaining argv again is harmless):
  // the rank that never joins must decide before calling Init.
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : 0;
  if (FLAGS_ignore_sigterm) ::signal(SIGTERM, SIG_IGN);
  if (FLAGS_mode == "skip_init" && rank == FLAGS_odd_rank) {
    std::printf("not joining\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  tessel::Init(&argc, &argv);
  auto& world = tessel::comm::World();
  if (FLAGS_mode == "sleep") {
    std::printf("ready pid=%d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  if (FLAGS_mode == "hang_collective" && rank == FLAGS_odd_rank) {
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  int64_t v = rank + 1;
  world.AllReduce(&v, 1, tessel::DType::kInt64, tessel::comm::ReduceOp::kSum);
  std::printf("all_reduce result %lld\n", static_cast<long long>(v));
  return 0;
}
