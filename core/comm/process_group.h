// The world and its process groups.
//
// InitWorld() performs rendezvous: rank 0 serves the TCP store, every rank
// proves the job secret and announces itself, and the world's Gloo
// communicator connects. Groups over
// any ordered subset of world ranks are created on first use and cached by
// rank list; creating one is collective over its members only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/dist_env.h"

namespace tessel::comm {

class TcpStore;  // core/comm/tcp_store.h (over Gloo's store; not a public header)

struct WorldOptions {
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(300)};
  // Address peers use to reach this process; empty picks 127.0.0.1 when all
  // ranks are on this node and the host name otherwise.
  std::string hostname;
  // Where rank 0's store listens; empty: MASTER_ADDR (127.0.0.1 when all
  // ranks are on this host). Never all interfaces unless asked ("0.0.0.0").
  std::string store_bind_addr;
  // The job secret ranks prove to the store; empty: a fresh one for a
  // single process, an error for several.
  std::string secret;
};

// Throws (naming ranks that never arrived, an unreachable master, a port in
// use, ...) if the world cannot be formed.
void InitWorld(const DistEnv& env, const WorldOptions& options);
bool IsWorldInitialized();
// Closes this rank's groups (peers still waiting on it in a collective
// fail at once). Rank 0 then keeps serving the store until every other rank
// has reached shutdown or gone (bounded by the rendezvous timeout), so the
// store outlives everyone's use but a rank that left early costs no wait.
void ShutdownWorld();

const DistEnv& GetDistEnv();
Communicator& World();
TcpStore& GetStore();
// The cached communicator over `world_ranks` (in that order). Members must
// call it in the same order; non-members get nullptr and take no part.
std::shared_ptr<Communicator> GetGroup(const std::vector<int>& world_ranks);

}  // namespace tessel::comm
