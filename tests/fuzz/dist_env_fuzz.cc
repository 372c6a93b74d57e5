// The launcher's environment (RANK, WORLD_SIZE, MASTER_PORT, ... and the
// job secret variables): input is NAME=VALUE lines; bad values throw
// tessel::Error, and accepted ones satisfy the documented ranges.
#include <cstdint>
#include <map>
#include <string>

#include "core/comm/dist_env.h"
#include "core/comm/job_secret.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> vars;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    start = nl == std::string::npos ? text.size() : nl + 1;
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string name = line.substr(0, eq);
    if (name == "TESSEL_JOB_SECRET_FILE") continue;  // no file system access from the fuzzer
    vars[name] = line.substr(eq + 1);
  }
  try {
    tessel::comm::DistEnv env = tessel::comm::ParseDistEnv(vars);
    if (env.rank < 0 || env.rank >= env.world_size || env.local_rank < 0 ||
        env.local_rank >= env.local_world_size || env.master_port < 0 || env.master_port > 65535)
      __builtin_trap();
  } catch (const tessel::Error&) {
  }
  try {
    std::string secret = tessel::comm::JobSecretFrom(vars);
    if (!secret.empty() &&
        (secret.size() < tessel::comm::kMinSecretChars || secret.size() > tessel::comm::kMaxSecretChars))
      __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
