// tessel-launch: starts one process per rank with torchrun-style variables,
// prefixes their output with the rank, watches their heartbeats, and stops
// the whole job as soon as one rank fails, falls silent or leaves early,
// naming it.
//
//   tessel-launch --nproc_per_node 4 -- ./my_program --flag value
#include <dirent.h>
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/flight_recorder.h"
#include "core/comm/heartbeat.h"
#include "core/comm/job_secret.h"
#include "core/error.h"
#include "core/flags_env.h"
#include "tools/launch/output_writer.h"
#include "tools/launch/rank_process.h"

DEFINE_int32(nproc_per_node, 1, "Processes (ranks) to start on this node");
DEFINE_int32(nnodes, 1, "Number of nodes in the job");
DEFINE_int32(node_rank, 0, "This node's index, 0 <= node_rank < nnodes");
DEFINE_string(
    master_addr, "127.0.0.1",
    "Host of global rank 0, which serves the rendezvous store there (loopback by default: a one-node "
    "job is reachable from this host only)");
DEFINE_int32(master_port, 29500, "Port of the rendezvous store; 0 picks a free port (single node only)");
DEFINE_int32(kill_grace_s, 5,
             "After a rank fails, seconds the others get after SIGTERM before SIGKILL [TESSEL_KILL_GRACE_S]");
DEFINE_int32(
    signal_grace_s, 60,
    "When the launcher gets SIGTERM, SIGINT or SIGHUP (a scheduler's preemption, Ctrl-C), seconds the "
    "ranks get after the SIGTERM it passes on before SIGKILL: tessel-train saves a checkpoint in that "
    "time. A second signal ends them at once [TESSEL_SIGNAL_GRACE_S]");
DEFINE_int32(max_run_s, 0, "Stop the whole job after this many seconds (0: no limit) [TESSEL_MAX_RUN_S]");
DEFINE_int32(heartbeat_timeout_s, 60,
             "Stop the job when a rank sends no heartbeat (or stays stopped by a signal) this long; 0: never "
             "[TESSEL_HEARTBEAT_TIMEOUT_S]");
DEFINE_string(secret_file, "",
              "File holding the job secret ranks prove to the rendezvous store (mode 600). Required with "
              "--nnodes > 1 unless TESSEL_JOB_SECRET is set; one node makes a fresh secret per job "
              "[TESSEL_SECRET_FILE]");
DEFINE_int32(threads_per_rank, 0,
             "OMP_NUM_THREADS for each rank; 0: cores available here / local ranks (at least 1). An "
             "OMP_NUM_THREADS already set is kept [TESSEL_THREADS_PER_RANK]");

namespace {

using Clock = std::chrono::steady_clock;
using tessel::comm::Heartbeat;
using tessel::launch::RankProcess;
using tessel::launch::Say;

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signals = 0;  // how many arrived: a second one ends the ranks at once
void OnSignal(int sig) {
  g_signal = sig;
  g_signals = g_signals + 1;
}

[[noreturn]] void Fail(const std::string& message) {
  tessel::launch::Output().Flush(1.0);  // what was said before, first
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
  if (FLAGS_signal_grace_s < 0) Fail("--signal_grace_s must be >= 0");
  if (FLAGS_max_run_s < 0) Fail("--max_run_s must be >= 0");
  if (FLAGS_heartbeat_timeout_s < 0) Fail("--heartbeat_timeout_s must be >= 0");
  if (FLAGS_threads_per_rank < 0) Fail("--threads_per_rank must be >= 0");
  if (argc < 2) Fail("no program given; usage: tessel-launch [flags] -- PROGRAM [ARGS...]");
}

// The launcher's own arguments end at "--" or at the first word that is not
// a flag or a flag's value: everything after belongs to the program, even
// words that look like the launcher's flags.
int LauncherArgCount(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") return i + 1;
    if (arg.size() < 2 || arg[0] != '-') return i;
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    if (name.find('=') != std::string::npos) continue;
    gflags::CommandLineFlagInfo info;
    bool known = gflags::GetCommandLineFlagInfo(name.c_str(), &info);
    if (!known && name.rfind("no", 0) == 0) continue;  // --nofoo for a bool
    if (known && info.type != "bool") ++i;             // "--flag value"
  }
  return argc;
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

// Each rank costs this launcher 3 descriptors (stdout, stderr, heartbeat)
// while it runs and 6 while it starts; rank 0 serves the store with one per
// rank. Raise the soft limit if the hard one allows, else fail before any
// rank starts.
void CheckDescriptors(int local_ranks, int world) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  rlim_t need = static_cast<rlim_t>(local_ranks) * 3 + 64;
  if (FLAGS_node_rank == 0) need = std::max(need, static_cast<rlim_t>(world) + 64);
  if (lim.rlim_cur >= need) return;
  if (lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= need) {
    lim.rlim_cur = need;
    if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
      Say("tessel-launch: raised the open-file limit to %llu for %d ranks\n",
          static_cast<unsigned long long>(need), local_ranks);
      return;
    }
  }
  Fail("--nproc_per_node=" + std::to_string(local_ranks) + " needs about " + std::to_string(need) +
       " open files, but the limit is " + std::to_string(lim.rlim_cur) + " (hard " +
       std::to_string(lim.rlim_max) + "); raise it (`ulimit -n " + std::to_string(need) +
       "`) or start fewer ranks");
}

int CoresAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

// Compute threads per rank: torchrun's rule, so ranks sharing a host do not
// oversubscribe its cores. oneDNN and OpenMP loops both follow OMP_NUM_THREADS.
void SetThreadsPerRank(std::map<std::string, std::string>& env) {
  if (const char* set = std::getenv("OMP_NUM_THREADS")) {
    Say("tessel-launch: OMP_NUM_THREADS=%s is set; each rank keeps it\n", set);
    return;
  }
  int cores = CoresAvailable();
  int threads =
      FLAGS_threads_per_rank > 0 ? FLAGS_threads_per_rank : std::max(1, cores / FLAGS_nproc_per_node);
  env["OMP_NUM_THREADS"] = std::to_string(threads);
  Say("tessel-launch: OMP_NUM_THREADS=%d for each of %d rank(s) (%d cores here%s)\n", threads,
      FLAGS_nproc_per_node, cores, FLAGS_threads_per_rank > 0 ? ", --threads_per_rank" : "");
}

std::string JobSecret() {
  try {
    if (!FLAGS_secret_file.empty()) return tessel::comm::ReadSecretFile(FLAGS_secret_file);
    std::string secret = tessel::comm::ReadJobSecret();
    if (!secret.empty()) return secret;
  } catch (const tessel::Error& e) {
    Fail(e.what());
  }
  if (FLAGS_nnodes > 1) {
    Fail("--nnodes=" + std::to_string(FLAGS_nnodes) +
         " needs a job secret shared by every node: give each launcher the same --secret_file (mode 600, "
         "e.g. from `openssl rand -hex 32`) or set TESSEL_JOB_SECRET");
  }
  return tessel::comm::NewJobSecret();
}

std::string Seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// What a rank had reported, and whether it still ran, when the launcher
// decided the job failed. Later heartbeats (ranks keep reporting while they
// are being stopped) describe the shutdown, not the failure.
struct RankAtFailure {
  int rank = -1;
  std::optional<tessel::comm::Heartbeat> heartbeat;
  Clock::time_point received{};  // when that heartbeat arrived
  bool killed = false;           // ended by a signal by then (its exit is the failure)
};

std::vector<RankAtFailure> SnapshotRanks(const std::vector<std::unique_ptr<RankProcess>>& ranks) {
  std::vector<RankAtFailure> out;
  for (const auto& r : ranks) {
    out.push_back(
        {r->rank(), r->heartbeat(), r->last_heartbeat(), !r->running() && WIFSIGNALED(r->wait_status())});
  }
  return out;
}

// After a failure: what each rank was doing when it happened, and which one
// diverged. A rank that was in a collective names the members of that group
// that were not in the same call (same op and sequence number) — only those
// whose own report is newer than the waiter's entry into the call (an older
// one says nothing about whether they reached it since), and never a rank
// killed by a signal (its death is the failure, reported on its own).
void Diagnose(const std::vector<RankAtFailure>& at_failure, Clock::time_point failed_at) {
  std::map<int, const RankAtFailure*> by_rank;
  for (const auto& r : at_failure) by_rank[r.rank] = &r;
  Say("tessel-launch: what each rank last reported before the failure:\n");
  for (const auto& r : at_failure) {
    std::string when;
    if (r.heartbeat) when = " (reported " + Seconds(failed_at - r.received) + " before the failure)";
    Say("tessel-launch:   rank %d: %s%s\n", r.rank,
        r.heartbeat ? tessel::comm::DescribeHeartbeat(*r.heartbeat).c_str()
                    : "no heartbeat (not a tessel program, or "
                      "it never reached tessel::Init)",
        when.c_str());
  }
  // Collectives some ranks are stuck in, and the members not in them.
  std::set<std::string> said;
  for (const auto& r : at_failure) {
    const auto& hb = r.heartbeat;
    if (r.killed || !hb || !hb->in_op || hb->op.rfind("post_", 0) == 0 || hb->op == "send" ||
        hb->op == "recv")
      continue;
    const Clock::time_point entered = r.received - std::chrono::milliseconds(hb->age_ms);
    std::vector<int> waiting, absent;
    for (int member : hb->group) {
      auto it = by_rank.find(member);
      if (it == by_rank.end()) continue;  // on another node: its launcher reports it
      const RankAtFailure& other = *it->second;
      if (other.heartbeat && other.heartbeat->in_op && tessel::comm::SameCollective(*hb, *other.heartbeat)) {
        waiting.push_back(member);
      } else if (!other.killed && other.heartbeat && other.received > entered) {
        absent.push_back(member);
      }
    }
    for (int member : absent) {
      std::string line = "rank " + std::to_string(member) + " never reached " + hb->op + " #" +
                         std::to_string(hb->seq) + " on group [" + tessel::comm::FormatRanks(hb->group) +
                         "], which rank(s) " + RankList(waiting) + " waited in";
      if (said.insert(line).second) Say("tessel-launch: %s\n", line.c_str());
    }
  }
}

}  // namespace

// The processes the ranks left behind when the job ends: members of a
// rank's process group (a wrapper script's program, data workers), and
// descendants that moved elsewhere (setsid) and were handed to this launcher
// when their parent died (it is their subreaper). Each is killed and reaped;
// the launcher says how many there were.
void EndLeftovers(const std::vector<std::unique_ptr<RankProcess>>& ranks) {
  int ended = 0;
  for (int round = 0; round < 20; ++round) {
    for (auto& r : ranks) r->Signal(SIGKILL);
    std::vector<pid_t> orphans;
    if (DIR* proc = ::opendir("/proc")) {
      while (dirent* e = ::readdir(proc)) {
        const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
        if (pid <= 0) continue;
        std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
        std::string line;
        if (!std::getline(stat, line)) continue;
        // pid (comm) state ppid ...: comm may hold spaces; read after the last ')'.
        const size_t close = line.rfind(')');
        if (close == std::string::npos) continue;
        char state = 0;
        int ppid = 0;
        if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == ::getpid() &&
            state != 'Z')
          orphans.push_back(pid);
      }
      ::closedir(proc);
    }
    for (pid_t pid : orphans) {
      ::kill(-pid, SIGKILL);  // its group, if it leads one
      ::kill(pid, SIGKILL);
    }
    ended += static_cast<int>(orphans.size());
    // Reap them; their own children come to this launcher next round.
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    while (Clock::now() < until) {
      int status;
      const pid_t reaped = ::waitpid(-1, &status, WNOHANG);
      if (reaped < 0) break;  // no children left
      if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (orphans.empty() && ::waitpid(-1, nullptr, WNOHANG) < 0) break;
  }
  if (ended > 0) Say("tessel-launch: ended %d process(es) the ranks had left running\n", ended);
}

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "start one process per rank for a tessel job\n"
      "usage: tessel-launch [flags] -- PROGRAM [ARGS...]\n\n"
      "Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "MASTER_ADDR, MASTER_PORT, TESSEL_JOB_SECRET (a fresh secret per job, proven to the\n"
      "rendezvous store) and OMP_NUM_THREADS (cores / local ranks unless set); its output\n"
      "lines are prefixed with [rank N]. Words after the program name are the program's.\n\n"
      "The job stops, and tessel-launch exits 1 naming the rank, when a rank exits\n"
      "non-zero or is killed, sends no heartbeat for --heartbeat_timeout_s (stopped or\n"
      "hung), or stays stopped by a signal that long. A rank that exits 0 while others\n"
      "still run is reported at once. On a collective timeout the launcher prints what\n"
      "each rank last ran and names the rank that never reached the collective.\n\n"
      "Every timeout can also be set in the environment as TESSEL_<FLAG> (upper case),\n"
      "for the launcher (TESSEL_KILL_GRACE_S, TESSEL_MAX_RUN_S, TESSEL_HEARTBEAT_TIMEOUT_S)\n"
      "and for the ranks, which inherit it (TESSEL_RENDEZVOUS_TIMEOUT_S,\n"
      "TESSEL_COMM_TIMEOUT_S); a flag on the command line wins.");
  gflags::SetVersionString("0.1.0");
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout (`| head`) must not end the job
  // Everything said goes out before the launcher exits, unless a reader
  // that stopped reading would hold it longer than this.
  struct FlushOutputAtExit {
    ~FlushOutputAtExit() { tessel::launch::Output().Flush(2.0); }
  } flush_output_at_exit;
  try {
    tessel::FlagDefaultsFromEnvironment(
        "TESSEL_", {"kill_grace_s", "signal_grace_s", "max_run_s", "heartbeat_timeout_s", "secret_file",
                    "threads_per_rank"});
  } catch (const tessel::Error& e) {
    Fail(e.what());
  }
  int own_argc = LauncherArgCount(argc, argv);
  std::vector<std::string> program(argv + own_argc, argv + argc);
  gflags::ParseCommandLineFlags(&own_argc, &argv, /*remove_flags=*/true);
  CheckFlags(program.empty() ? 1 : 2);
  CheckProgram(program[0]);

  const int world = FLAGS_nproc_per_node * FLAGS_nnodes;
  CheckDescriptors(FLAGS_nproc_per_node, world);
  const int port = FLAGS_master_port == 0 ? PickFreePort() : FLAGS_master_port;
  const std::string secret = JobSecret();
  std::map<std::string, std::string> common = {
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(FLAGS_nproc_per_node)},
      {"GROUP_RANK", std::to_string(FLAGS_node_rank)},
      {"MASTER_ADDR", FLAGS_master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TESSEL_JOB_SECRET", secret},
  };
  SetThreadsPerRank(common);

  // Descendants whose parent dies (a killed wrapper's program, a setsid
  // worker) become this launcher's children, so none outlives the job.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);

  const int first_local = FLAGS_node_rank * FLAGS_nproc_per_node;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  std::set<std::string> fatal_errors_printed;  // each said once, whichever ranks hit it
  for (int local = 0; local < FLAGS_nproc_per_node; ++local) {
    std::map<std::string, std::string> env = common;
    env["RANK"] = std::to_string(first_local + local);
    env["LOCAL_RANK"] = std::to_string(local);
    try {
      ranks.push_back(std::make_unique<RankProcess>(first_local + local, program, env));
      ranks.back()->ShareFatalErrors(&fatal_errors_printed);
    } catch (const std::exception& e) {
      for (auto& r : ranks) r->Signal(SIGKILL);
      Fail(std::string("cannot start rank ") + std::to_string(first_local + local) + ": " + e.what());
    }
  }

  const auto start = Clock::now();
  const auto heartbeat_limit = std::chrono::seconds(FLAGS_heartbeat_timeout_s);
  int failed_rank = -1;     // the rank whose failure stopped the job
  std::string stop_reason;  // why the launcher stopped the job, if it did
  bool diagnose = false;    // a collective may have diverged: print what each rank ran
  Clock::time_point kill_at{};
  bool stopping = false;
  std::set<int> early_reported;  // ranks reported as finishing while others ran

  Clock::time_point term_at{};  // when the pending SIGTERM goes out (stopping)
  bool term_sent = false;
  auto terminate_all = [&] {
    // Every rank's process group, also of ranks that ended: what they
    // started (a wrapper script's program, data workers) is stopped too.
    for (auto& r : ranks) {
      r->Signal(SIGTERM);
      r->Signal(SIGCONT);  // a stopped rank only sees SIGTERM once continued
    }
    term_sent = true;
  };
  // `quiet`: the failed rank said why (a fatal error). The others get a
  // moment to end on their own before SIGTERM, since a mistake in the
  // config or the data stops every rank with the same error, said once.
  std::vector<RankAtFailure> at_failure;  // the ranks' reports when the job was stopped
  Clock::time_point failed_at{};
  auto stop_all = [&](const std::string& reason, int grace_s, bool quiet = false) {
    if (!stopping) {
      at_failure = SnapshotRanks(ranks);
      failed_at = Clock::now();
    }
    stopping = true;
    stop_reason = reason;
    if (!quiet) Say("tessel-launch: %s; stopping the other ranks\n", reason.c_str());
    // Sent at the end of this pass of the loop, or 2 s on.
    term_at = Clock::now() + std::chrono::milliseconds(quiet ? 2000 : 0);
    kill_at = term_at + std::chrono::seconds(grace_s);
  };
  auto by_rank = [&](int rank) -> RankProcess& { return *ranks[rank - first_local]; };
  // A rank that finished (exited 0, or reported reaching shutdown) while
  // others still ran: the likely root cause of failures that follow.
  auto early_leaver = [&](int except) -> const RankProcess* {
    const RankProcess* first = nullptr;
    Clock::time_point first_at{};
    for (auto& r : ranks) {
      if (r->rank() == except) continue;
      Clock::time_point at;
      if (!r->running() && !r->failed()) {
        at = r->exited_at();
      } else if (r->running() && r->heartbeat() && r->heartbeat()->phase == "done") {
        at = r->last_heartbeat();
      } else {
        continue;
      }
      if (!first || at < first_at) first = r.get(), first_at = at;
    }
    return first;
  };
  auto finished_at = [&](const RankProcess& r) { return r.running() ? r.last_heartbeat() : r.exited_at(); };

  Clock::time_point all_exited_at{};
  while (true) {
    std::vector<pollfd> fds;
    std::vector<RankProcess*> owners;
    for (auto& r : ranks) {
      // Output waits unread while the launcher's own stream is full
      // (back-pressure on the ranks, as a pipe gives); heartbeats and exits
      // are watched regardless.
      const bool out_full = tessel::launch::Output().Full(STDOUT_FILENO);
      const bool err_full = tessel::launch::Output().Full(STDERR_FILENO);
      for (int fd : {out_full ? -1 : r->stdout_fd(), err_full ? -1 : r->stderr_fd(), r->heartbeat_fd()}) {
        if (fd >= 0) {
          fds.push_back({fd, POLLIN, 0});
          owners.push_back(r.get());
        }
      }
    }
    ::poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == owners[i]->heartbeat_fd()) {
        owners[i]->ReadHeartbeats();
      } else {
        owners[i]->Pump(fds[i].fd);
      }
    }

    // Reap exits, and note stops and continues.
    int status = 0;
    pid_t pid;
    int newly_failed = -1;
    while ((pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
      for (auto& r : ranks) {
        if (r->pid() != pid) continue;
        if (WIFSTOPPED(status)) {
          r->SetStopped(WSTOPSIG(status), Clock::now());
          Say("tessel-launch: rank %d (pid %d) was stopped by signal %d (%s); the job stops unless it "
              "continues within %d s\n",
              r->rank(), pid, WSTOPSIG(status), ::strsignal(WSTOPSIG(status)), FLAGS_heartbeat_timeout_s);
        } else if (WIFCONTINUED(status)) {
          r->SetContinued();
          Say("tessel-launch: rank %d (pid %d) continued\n", r->rank(), pid);
        } else {
          r->SetExited(status);
          if (r->failed() && newly_failed < 0) newly_failed = r->rank();
        }
      }
    }
    auto now = Clock::now();
    if (newly_failed >= 0 && !stopping) {
      failed_rank = newly_failed;
      auto& r = by_rank(failed_rank);
      r.Drain();  // its last words, a fatal error say, before the launcher's
      std::string reason = "rank " + std::to_string(failed_rank) + " (pid " + std::to_string(r.pid()) + ") " +
                           r.DescribeExit();
      if (const RankProcess* leaver = early_leaver(failed_rank)) {
        reason += ", " + Seconds(r.exited_at() - finished_at(*leaver)) + " after rank " +
                  std::to_string(leaver->rank()) + " had left the job early (" +
                  (leaver->running() ? "reached shutdown" : leaver->DescribeExit()) +
                  ") while the others still ran: ranks are out of lockstep — rank " +
                  std::to_string(leaver->rank()) +
                  " ran fewer collectives than its peers, the likely root cause";
      }
      diagnose = true;
      // A rank that said why it failed: its error is the news, the summary
      // at the end says the rest.
      stop_all(reason, FLAGS_kill_grace_s, /*quiet=*/!r.fatal_error().empty());
    }
    // Ranks that finished while others run: said at once, once.
    if (!stopping) {
      std::vector<int> still;
      for (auto& r : ranks) {
        if (r->running() && !(r->heartbeat() && r->heartbeat()->phase == "done")) still.push_back(r->rank());
      }
      for (auto& r : ranks) {
        bool finished = !r->running() || (r->heartbeat() && r->heartbeat()->phase == "done");
        if (!finished || still.empty() || early_reported.count(r->rank())) continue;
        // Ranks of a healthy job finish within moments of each other.
        auto since = !r->running() ? r->exited_at() : r->last_heartbeat();
        if (now - since < std::chrono::milliseconds(500)) continue;
        early_reported.insert(r->rank());
        Say("tessel-launch: rank %d %s while rank(s) %s still run\n", r->rank(),
            r->running() ? "finished (reached shutdown)" : r->DescribeExit().c_str(),
            RankList(still).c_str());
      }
    }
    // Silence: no heartbeat, or stopped by a signal, past the limit.
    if (!stopping && FLAGS_heartbeat_timeout_s > 0) {
      for (auto& r : ranks) {
        if (!r->running()) continue;
        std::string why;
        if (r->stopped_signal() != 0) {
          // Stopped: counted from the stop, which also covers programs that
          // send no heartbeats.
          if (now - r->stopped_at() > heartbeat_limit) {
            why = "has been stopped by signal " + std::to_string(r->stopped_signal()) + " (" +
                  ::strsignal(r->stopped_signal()) + ") for " + Seconds(now - r->stopped_at());
          }
        } else if (r->heartbeat() && now - r->last_heartbeat() > heartbeat_limit) {
          why = "sent no heartbeat for " + Seconds(now - r->last_heartbeat()) +
                " (stopped, hung in the kernel, or starved of CPU)";
        }
        if (why.empty()) continue;
        failed_rank = r->rank();
        std::string last =
            r->heartbeat() ? "; it was " + tessel::comm::DescribeHeartbeat(*r->heartbeat()) : "";
        stop_all(
            "rank " + std::to_string(r->rank()) + " (pid " + std::to_string(r->pid()) + ") " + why + last,
            FLAGS_kill_grace_s);
        break;
      }
    }
    if (g_signal != 0 && !stopping) {
      // Asked from outside: the ranks may save their work first.
      stop_all(std::string("received ") + ::strsignal(g_signal) + " (the ranks get --signal_grace_s=" +
                   std::to_string(FLAGS_signal_grace_s) + " s to finish; a second signal ends them now)",
               FLAGS_signal_grace_s);
    } else if (g_signals >= 2 && stopping && kill_at > now) {
      Say("tessel-launch: a second signal; ending the ranks now\n");
      kill_at = now;
    }
    if (FLAGS_max_run_s > 0 && !stopping && now - start > std::chrono::seconds(FLAGS_max_run_s)) {
      stop_all("the job ran past --max_run_s=" + std::to_string(FLAGS_max_run_s), FLAGS_kill_grace_s);
    }
    if (stopping && !term_sent && now >= term_at) terminate_all();
    if (stopping && now >= kill_at) {
      for (auto& r : ranks) r->Signal(SIGKILL);
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
  EndLeftovers(ranks);

  if (stopping) {
    // Every rank failed with the same error (a config mistake, a missing
    // file): it was printed once, and one line ends the job.
    const bool same_error = failed_rank >= 0 && std::all_of(ranks.begin(), ranks.end(), [&](const auto& r) {
                              return r->failed() && !r->fatal_error().empty() &&
                                     r->fatal_error() == ranks[0]->fatal_error() &&
                                     r->wait_status() == ranks[0]->wait_status();
                            });
    if (same_error) {
      Say("tessel-launch: job failed: rank%s %s %s, each after the error above\n",
          ranks.size() == 1 ? "" : "s",
          tessel::comm::FormatRanks([&] {
            std::vector<int> all;
            for (const auto& r : ranks) all.push_back(r->rank());
            return all;
          }())
              .c_str(),
          ranks[0]->DescribeExit().c_str());
      return 1;
    }
    if (diagnose) Diagnose(at_failure, failed_at);
    // Stopped from outside with every rank ending cleanly (tessel-train
    // saved and stopped): not a failure of the job's own.
    const bool clean_stop =
        g_signal != 0 && failed_rank < 0 &&
        std::all_of(ranks.begin(), ranks.end(), [](const auto& r) { return !r->running() && !r->failed(); });
    Say("tessel-launch: job %s: %s\n", clean_stop ? "stopped" : "failed", stop_reason.c_str());
    for (auto& r : ranks) {
      if (r->rank() != failed_rank) {
        Say("tessel-launch:   rank %d %s\n", r->rank(), r->DescribeExit().c_str());
      }
    }
    if (g_signal != 0 && failed_rank < 0) return 128 + g_signal;
    if (FLAGS_max_run_s > 0 && failed_rank < 0) return 124;
    return 1;
  }
  return 0;
}
