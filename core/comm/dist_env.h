// The torchrun-style environment a launcher gives each process.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace tessel::comm {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;         // 0: single process, serve the store on any free port
  bool from_launcher = false;  // WORLD_SIZE was set
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT. With none set, a single-process world. Throws an Error naming
// the variable, its value and what was expected on anything invalid.
DistEnv ReadDistEnv();
// Same, from an explicit map (for tests).
DistEnv ParseDistEnv(const std::map<std::string, std::string>& vars);

}  // namespace tessel::comm
