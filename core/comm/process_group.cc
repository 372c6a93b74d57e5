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
#include "core/error.h"

namespace tessel::comm {

namespace {

struct WorldState {
  DistEnv env;
  WorldOptions options;
  std::unique_ptr<TcpStoreServer> server;  // rank 0 only
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

  int port = env.master_port;
  if (env.rank == 0) {
    state->server = std::make_unique<TcpStoreServer>(env.master_port);
    port = state->server->port();
  }
  std::string host = env.rank == 0 ? std::string("127.0.0.1") : env.master_addr;
  state->store = std::make_unique<TcpStore>(host, port, options.rendezvous_timeout);

  // Announce and wait for everyone, so a missing rank is named, not guessed.
  state->store->set("tessel/join/" + std::to_string(env.rank), {});
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back("tessel/join/" + std::to_string(r));
  std::vector<std::string> missing = state->store->WaitFor(keys, options.rendezvous_timeout);
  if (!missing.empty()) {
    std::ostringstream ranks;
    for (size_t i = 0; i < missing.size(); ++i) ranks << (i ? ", " : "") << missing[i].substr(12);
    TESSEL_THROW(StatusCode::kTimeout)
        << "rendezvous timed out after " << options.rendezvous_timeout.count() / 1000.0 << " s at rank "
        << env.rank << ": rank(s) " << ranks.str() << " of WORLD_SIZE=" << env.world_size
        << " never joined (store at " << env.master_addr << ":" << port << ")";
  }

  state->device = CreateGlooTcpDevice(options.hostname.empty() ? DefaultHostname(env) : options.hostname);
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  state->world = std::make_shared<GlooCommunicator>(*state->store, "tessel/group/" + RankList(all),
                                                    state->device, all, env.rank, options.comm_timeout);
  state->groups[all] = state->world;
  g_state = state.release();
  VLOG(1) << "rank " << env.rank << " joined a world of " << env.world_size;
}

bool IsWorldInitialized() { return g_state != nullptr; }

void ShutdownWorld() {
  if (g_state == nullptr) return;
  WorldState& s = *g_state;
  int64_t arrived = s.store->Add("tessel/exit", 1);
  if (s.env.rank == 0 && arrived < s.env.world_size) {
    // Keep serving the store until every rank is done with it.
    auto deadline = std::chrono::steady_clock::now() + s.options.rendezvous_timeout;
    while (s.store->Add("tessel/exit", 0) < s.env.world_size) {
      if (std::chrono::steady_clock::now() > deadline) {
        LOG(WARNING) << "rank 0 exits before all ranks reached shutdown; the rendezvous store goes with it";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
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
