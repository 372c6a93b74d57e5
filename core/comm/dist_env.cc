#include "core/comm/dist_env.h"

#include <charconv>
#include <cstdlib>

#include "core/error.h"

namespace tessel::comm {

namespace {
const char* kVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};

std::optional<std::string> Lookup(const std::map<std::string, std::string>& vars, const std::string& name) {
  auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

int ParseInt(const std::string& name, const std::string& text, int lo, int hi, const std::string& expected) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  TESSEL_CHECK(!text.empty() && ec == std::errc() && ptr == text.data() + text.size())
      << "environment variable " << name << "='" << text << "' is not an integer; expected " << expected;
  TESSEL_CHECK(value >= lo && value <= hi)
      << "environment variable " << name << "=" << value << " is out of range; expected " << expected;
  return value;
}
}  // namespace

DistEnv ParseDistEnv(const std::map<std::string, std::string>& vars) {
  DistEnv env;
  auto world = Lookup(vars, "WORLD_SIZE");
  auto rank = Lookup(vars, "RANK");
  if (!world) {
    TESSEL_CHECK(!rank) << "RANK=" << *rank << " is set but WORLD_SIZE is not; set both "
                        << "(tessel-launch does) or neither for a single process";
    if (auto port = Lookup(vars, "MASTER_PORT")) {
      env.master_port = ParseInt("MASTER_PORT", *port, 0, 65535, "a TCP port 0..65535");
    }
    return env;
  }
  env.from_launcher = true;
  env.world_size = ParseInt("WORLD_SIZE", *world, 1, 1 << 20, "a positive integer");
  TESSEL_CHECK(rank.has_value()) << "WORLD_SIZE=" << env.world_size << " is set but RANK is not";
  env.rank = ParseInt("RANK", *rank, 0, env.world_size - 1,
                      "0 <= RANK < WORLD_SIZE=" + std::to_string(env.world_size));
  env.local_world_size = env.world_size;
  if (auto lws = Lookup(vars, "LOCAL_WORLD_SIZE")) {
    env.local_world_size = ParseInt("LOCAL_WORLD_SIZE", *lws, 1, env.world_size,
                                    "1 <= LOCAL_WORLD_SIZE <= WORLD_SIZE=" + std::to_string(env.world_size));
  }
  env.local_rank = env.rank % env.local_world_size;
  if (auto lr = Lookup(vars, "LOCAL_RANK")) {
    env.local_rank = ParseInt("LOCAL_RANK", *lr, 0, env.local_world_size - 1,
                              "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size));
  }
  if (auto addr = Lookup(vars, "MASTER_ADDR")) {
    TESSEL_CHECK(!addr->empty()) << "MASTER_ADDR is set but empty; expected a host name or address";
    env.master_addr = *addr;
  } else {
    TESSEL_CHECK(env.world_size == 1)
        << "WORLD_SIZE=" << env.world_size << " but MASTER_ADDR is not set; expected the host of rank 0";
  }
  if (auto port = Lookup(vars, "MASTER_PORT")) {
    env.master_port =
        ParseInt("MASTER_PORT", *port, env.world_size == 1 ? 0 : 1, 65535, "a TCP port 1..65535");
  } else {
    TESSEL_CHECK(env.world_size == 1)
        << "WORLD_SIZE=" << env.world_size << " but MASTER_PORT is not set; expected rank 0's store port";
  }
  return env;
}

DistEnv ReadDistEnv() {
  std::map<std::string, std::string> vars;
  for (const char* name : kVars) {
    if (const char* value = std::getenv(name)) vars[name] = value;
  }
  return ParseDistEnv(vars);
}

}  // namespace tessel::comm
