#include "core/flags_env.h"

#include <gflags/gflags.h>

#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace tessel {

void FlagDefaultsFromEnvironment(const std::string& prefix, const std::vector<std::string>& flags) {
  for (const std::string& flag : flags) {
    std::string var = prefix;
    for (char c : flag) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    std::string result = gflags::SetCommandLineOptionWithMode(flag.c_str(), value, gflags::SET_FLAGS_DEFAULT);
    TESSEL_CHECK(!result.empty()) << "environment variable " << var << "='" << value
                                  << "' is not a valid value for --" << flag;
  }
}

}  // namespace tessel
