#include "core/init.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <iostream>

#include "core/comm/job_secret.h"
#include "core/comm/process_group.h"
#include "core/error.h"
#include "core/flags_env.h"

DEFINE_int32(rendezvous_timeout_s, 300,
             "Seconds to wait for all ranks to join (and for the master to be reachable) before failing");
DEFINE_int32(comm_timeout_s, 300, "Seconds a collective may wait for its peers before failing");
DEFINE_string(comm_hostname, "",
              "Address peers use to reach this process (default: 127.0.0.1 on one node, else the host name)");
DEFINE_string(
    store_bind_addr, "",
    "Address rank 0's rendezvous store listens on (default: MASTER_ADDR, which is loopback when all "
    "ranks are on one host); 0.0.0.0 listens on every interface");

DEFINE_bool(check_lockstep, false,
            "Debug: ranks compare every layout change they request, so one asking for something else fails "
            "at once, named, on every rank (adds a world-wide collective per layout change)");

namespace tessel {

namespace {
int g_rank = -1;
std::atomic<bool> g_lockstep_checks{false};

[[noreturn]] void OnTerminate() {
  std::string prefix = g_rank >= 0 ? "tessel: fatal error on rank " + std::to_string(g_rank) + ": "
                                   : std::string("tessel: fatal error: ");
  if (auto ex = std::current_exception()) {
    try {
      std::rethrow_exception(ex);
    } catch (const std::exception& e) {
      std::cerr << prefix << e.what() << std::endl;
    } catch (...) {
      std::cerr << prefix << "unknown exception" << std::endl;
    }
  } else {
    std::cerr << prefix << "std::terminate called without an exception" << std::endl;
  }
  std::_Exit(1);
}

void CheckPositive(const char* flag, int value) {
  TESSEL_CHECK(value > 0) << "--" << flag << "=" << value << " must be a positive number of seconds";
}
}  // namespace

void InitProcess(int* argc, char*** argv) {
  std::set_terminate(OnTerminate);
  // Every timeout and address flag may come from TESSEL_<FLAG> too (the
  // command line wins), so a launcher or batch script can set them for all
  // ranks without editing each program's arguments.
  FlagDefaultsFromEnvironment("TESSEL_", {"rendezvous_timeout_s", "comm_timeout_s", "comm_hostname",
                                          "store_bind_addr", "check_lockstep"});
  gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true);
  if (gflags::GetCommandLineFlagInfoOrDie("logtostderr").is_default &&
      gflags::GetCommandLineFlagInfoOrDie("log_dir").is_default) {
    FLAGS_logtostderr = true;  // the launcher collects stderr per rank
  }
  google::InitGoogleLogging((*argv)[0]);

  SetLockstepChecks(FLAGS_check_lockstep);
  CheckPositive("rendezvous_timeout_s", FLAGS_rendezvous_timeout_s);
  CheckPositive("comm_timeout_s", FLAGS_comm_timeout_s);
  comm::DistEnv env = comm::ReadDistEnv();
  g_rank = env.rank;
  comm::WorldOptions options;
  options.rendezvous_timeout = std::chrono::seconds(FLAGS_rendezvous_timeout_s);
  options.comm_timeout = std::chrono::seconds(FLAGS_comm_timeout_s);
  options.hostname = FLAGS_comm_hostname;
  options.store_bind_addr = FLAGS_store_bind_addr;
  options.secret = comm::ReadJobSecret();
  comm::InitWorld(env, options);
  std::atexit(Shutdown);
}

void Shutdown() { comm::ShutdownWorld(); }

bool LockstepChecksEnabled() { return g_lockstep_checks.load(std::memory_order_relaxed); }
void SetLockstepChecks(bool enabled) { g_lockstep_checks.store(enabled, std::memory_order_relaxed); }

}  // namespace tessel
