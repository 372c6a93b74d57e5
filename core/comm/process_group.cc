#include "core/comm/process_group.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "core/comm/gloo_communicator.h"
#include "core/comm/gloo_pair_guard.h"
#include "core/comm/heartbeat.h"
#include "core/comm/job_secret.h"
#include "core/comm/socket.h"
#include "core/comm/tcp_store.h"
#include "core/error.h"

namespace tessel::comm {

namespace {

struct WorldState {
  DistEnv env;
  WorldOptions options;
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
  bool left = false;                       // ShutdownWorld ran (a second call does nothing)
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<Communicator> world;
  std::map<std::vector<int>, std::shared_ptr<Communicator>> groups;
  std::mutex mu;
};

WorldState* g_state = nullptr;

WorldState& State() {
  TESSEL_CHECK_CODE(g_state != nullptr, StatusCode::kInternal)
      << "the world is not initialized; call tessel::Init(&argc, &argv) first";
  return *g_state;
}

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
  return os.str();
}

std::string DefaultHostname(const DistEnv& env) {
  if (env.local_world_size == env.world_size) return "127.0.0.1";
  char name[256] = {0};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

void InitWorld(const DistEnv& env, const WorldOptions& options) {
  TESSEL_CHECK(g_state == nullptr) << "tessel::Init was called twice";
  auto state = std::make_unique<WorldState>();
  state->env = env;
  state->options = options;
  StartHeartbeat(env.rank);

  std::string secret = options.secret;
  if (secret.empty()) {
    TESSEL_CHECK(env.world_size == 1)
        << "WORLD_SIZE=" << env.world_size << " but no job secret is set: give every rank the same "
        << "TESSEL_JOB_SECRET (at least " << kMinSecretChars << " characters) or TESSEL_JOB_SECRET_FILE; "
        << "tessel-launch does this for you";
    secret = NewJobSecret();  // a single process talks only to itself
  }

  // The store listens where MASTER_ADDR points (loopback for one host),
  // never on every interface by default.
  std::string host = env.world_size == 1 && !env.from_launcher ? std::string("127.0.0.1") : env.master_addr;
  int port = env.master_port;
  if (env.rank == 0) {
    TcpStoreServer::Options server;
    server.host = options.store_bind_addr.empty() ? host : options.store_bind_addr;
    server.port = env.master_port;
    server.secret = secret;
    if (env.local_world_size < env.world_size && IsLoopbackHost(server.host)) {
      LOG(WARNING) << "the rendezvous store listens on " << server.host
                   << ", a loopback address, but the job spans several nodes: ranks on other nodes cannot "
                   << "reach it unless they run on this host too. Set MASTER_ADDR to an address of this host "
                   << "that the other nodes reach.";
    }
    state->server = std::make_unique<TcpStoreServer>(server);
    port = state->server->port();
    host = server.host == "0.0.0.0" || server.host == "::" ? std::string("127.0.0.1") : server.host;
  }
  state->store = std::make_unique<TcpStore>(host, port, secret, env.rank, options.rendezvous_timeout);

  // Announce, count, and wait on one key: O(world) store traffic in all.
  // The per-rank keys are only read on a timeout, to name who is missing.
  TcpStore& store = *state->store;
  store.set("tessel/join/" + std::to_string(env.rank), {});
  if (store.Add("tessel/joined", 1) == env.world_size) store.set("tessel/all_joined", {});
  if (!store.WaitFor({"tessel/all_joined"}, options.rendezvous_timeout).empty()) {
    std::vector<std::string> keys;
    for (int r = 0; r < env.world_size; ++r) keys.push_back("tessel/join/" + std::to_string(r));
    std::vector<bool> present = store.Check(keys);
    std::ostringstream ranks;
    int shown = 0, missing = 0;
    for (int r = 0; r < env.world_size; ++r) {
      if (present[r]) continue;
      ++missing;
      if (shown++ < 32) ranks << (shown > 1 ? ", " : "") << r;
    }
    if (missing > shown) ranks << ", ... (" << missing << " in all)";
    TESSEL_THROW(StatusCode::kTimeout)
        << "rendezvous timed out after " << options.rendezvous_timeout.count() / 1000.0 << " s at rank "
        << env.rank << ": rank(s) " << ranks.str() << " of WORLD_SIZE=" << env.world_size
        << " never joined (store at " << store.address() << ")";
  }

  PairGuardOptions guard;
  guard.connect_timeout = options.comm_timeout;
  GuardGlooPairs(secret, guard);
  state->device = CreateGlooTcpDevice(options.hostname.empty() ? DefaultHostname(env) : options.hostname);
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  state->world = std::make_shared<GlooCommunicator>(*state->store, "tessel/group/" + RankList(all),
                                                    state->device, all, env.rank, options.comm_timeout);
  state->groups[all] = state->world;
  g_state = state.release();
  SendHeartbeatNow("run");
  VLOG(1) << "rank " << env.rank << " joined a world of " << env.world_size;
}

bool IsWorldInitialized() { return g_state != nullptr; }

namespace {
// Rank 0 keeps serving the store while others may still need it (groups
// without rank 0 connect through it), until each has arrived or gone.
void WaitForPeersToLeave(WorldState& s) {
  auto deadline = std::chrono::steady_clock::now() + s.options.rendezvous_timeout;
  while (true) {
    if (s.store->Add("tessel/exit", 0) >= s.env.world_size) return;
    std::multiset<int> connected = s.server->ConnectedRanks();
    if (connected.size() <= 1) return;  // only this rank's own client is left
    if (std::chrono::steady_clock::now() > deadline) {
      LOG(WARNING) << "rank 0 exits before all ranks reached shutdown; the rendezvous store goes with it";
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}
}  // namespace

void ShutdownWorld() {
  if (g_state == nullptr || g_state->left) return;
  WorldState& s = *g_state;
  s.left = true;
  SendHeartbeatNow("done");
  {
    // A peer still waiting on this rank in a collective fails now, naming
    // the lost connection, instead of at its timeout.
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& [ranks, group] : s.groups) group->Close();
  }
  int64_t arrived = s.store->Add("tessel/exit", 1);
  if (s.server == nullptr) return;
  if (arrived < s.env.world_size) WaitForPeersToLeave(s);
  // Stop the server's thread before the process exits: a connection that
  // arrived during static destruction was logged from that thread after
  // glog had gone, and rank 0 crashed at exit under a connection flood.
  s.server.reset();
}

const DistEnv& GetDistEnv() { return State().env; }
Communicator& World() { return *State().world; }
TcpStore& GetStore() { return *State().store; }

std::shared_ptr<Communicator> GetGroup(const std::vector<int>& world_ranks) {
  WorldState& s = State();
  TESSEL_CHECK(!world_ranks.empty()) << "a process group needs at least one rank";
  std::set<int> seen;
  for (int r : world_ranks) {
    TESSEL_CHECK(r >= 0 && r < s.env.world_size)
        << "process group [" << RankList(world_ranks) << "] names rank " << r
        << ", outside the world of WORLD_SIZE=" << s.env.world_size;
    TESSEL_CHECK(seen.insert(r).second)
        << "process group [" << RankList(world_ranks) << "] lists rank " << r << " twice";
  }
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.groups.find(world_ranks);
  if (it != s.groups.end()) return it->second;
  auto pos = std::find(world_ranks.begin(), world_ranks.end(), s.env.rank);
  if (pos == world_ranks.end()) return nullptr;
  auto comm = std::make_shared<GlooCommunicator>(*s.store, "tessel/group/" + RankList(world_ranks), s.device,
                                                 world_ranks, static_cast<int>(pos - world_ranks.begin()),
                                                 s.options.comm_timeout);
  s.groups[world_ranks] = comm;
  return comm;
}

}  // namespace tessel::comm
