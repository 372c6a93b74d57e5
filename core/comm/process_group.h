// The world and its process groups.
//
// InitWorld() performs rendezvous: rank 0 serves the TCP store, every rank
// announces itself, and the world's Gloo communicator connects. Groups over
// any ordered subset of world ranks are created on first use and cached by
// rank list; creating one is collective over its members only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/comm/dist_env.h"
#include "core/comm/tcp_store.h"

namespace tessel::comm {

struct WorldOptions {
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(300)};
  // Address peers use to reach this process; empty picks 127.0.0.1 when all
  // ranks are on this node and the host name otherwise.
  std::string hostname;
};

// Throws (naming ranks that never arrived, an unreachable master, a port in
// use, ...) if the world cannot be formed.
void InitWorld(const DistEnv& env, const WorldOptions& options);
bool IsWorldInitialized();
// Rank 0 waits (bounded by the rendezvous timeout) until every rank has
// reached ShutdownWorld, so the store it serves outlives everyone's use.
void ShutdownWorld();

const DistEnv& GetDistEnv();
Communicator& World();
TcpStore& GetStore();
// The cached communicator over `world_ranks` (in that order). Members must
// call it in the same order; non-members get nullptr and take no part.
std::shared_ptr<Communicator> GetGroup(const std::vector<int>& world_ranks);

}  // namespace tessel::comm
