// A small program for the launcher and rendezvous failure tests: it plays a
// rank that behaves (or misbehaves) as --mode says.
#include <gflags/gflags.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/comm/process_group.h"
#include "core/init.h"

DEFINE_string(mode, "allreduce",
              "allreduce: join, all-reduce once, exit 0 | sleep: join, print ready, sleep | "
              "skip_init: --odd_rank never joins | hang_collective: --odd_rank skips the second all-reduce | "
              "exit_early: --odd_rank returns 0 before the second all-reduce | "
              "loop: all-reduce every 50 ms, printing each result | env: print OMP_NUM_THREADS | "
              "left: join, all-reduce once, call tessel::Shutdown() twice, print left, sleep");
DEFINE_int32(odd_rank, -1, "The rank that misbehaves in skip_init and hang_collective");
DEFINE_int32(iterations, -1, "loop: stop after this many all-reduces (-1: never)");
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
  if (FLAGS_mode == "env") {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    std::printf("OMP_NUM_THREADS=%s argc=%d%s%s\n", omp ? omp : "(unset)", argc, argc > 1 ? " arg1=" : "",
                argc > 1 ? argv[1] : "");
    return 0;
  }
  tessel::InitProcess(&argc, &argv);  // core only
  auto& world = tessel::comm::World();
  if (FLAGS_mode == "sleep") {
    std::printf("ready pid=%d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  if (FLAGS_mode == "left") {
    int64_t joined = 1;  // every rank has connected before any leaves
    world.AllReduce(&joined, 1, tessel::DType::kInt64, tessel::comm::ReduceOp::kSum);
    tessel::Shutdown();
    tessel::Shutdown();  // harmless a second time
    std::printf("left pid=%d\n", static_cast<int>(::getpid()));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 0;
  }
  if (FLAGS_mode == "loop") {
    std::printf("ready pid=%d\n", static_cast<int>(::getpid()));
    for (int64_t i = 0; FLAGS_iterations < 0 || i < FLAGS_iterations; ++i) {
      int64_t v = rank + 1;
      world.AllReduce(&v, 1, tessel::DType::kInt64, tessel::comm::ReduceOp::kSum);
      std::printf("iteration %lld sum %lld\n", static_cast<long long>(i), static_cast<long long>(v));
      std::fflush(stdout);
      if (FLAGS_iterations < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return 0;
  }
  if (FLAGS_mode == "hang_collective" || FLAGS_mode == "exit_early") {
    int64_t first = 1;  // one collective in step, so the divergence is the second
    world.AllReduce(&first, 1, tessel::DType::kInt64, tessel::comm::ReduceOp::kSum);
    if (rank == FLAGS_odd_rank) {
      if (FLAGS_mode == "exit_early") return 0;
      std::this_thread::sleep_for(std::chrono::seconds(600));
      return 0;
    }
  }
  int64_t v = rank + 1;
  world.AllReduce(&v, 1, tessel::DType::kInt64, tessel::comm::ReduceOp::kSum);
  std::printf("all_reduce result %lld\n", static_cast<long long>(v));
  // 1 + 2 + ... + world: a wrong sum fails the run (and the ctest using it).
  const int64_t n = world.size(), want = n * (n + 1) / 2;
  if (v != want) {
    std::fprintf(stderr, "all_reduce gave %lld, expected %lld\n", static_cast<long long>(v),
                 static_cast<long long>(want));
    return 1;
  }
  return 0;
}
