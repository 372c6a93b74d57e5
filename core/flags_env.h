// Flags that may also be set from the environment.
//
// `--comm_timeout_s` can be given as TESSEL_COMM_TIMEOUT_S: the variable is
// the flag's name in upper case with a prefix. The command line wins over
// the environment; a variable that does not parse as the flag's type is an
// error naming both.
#pragma once

#include <string>
#include <vector>

namespace tessel {

// Call before gflags::ParseCommandLineFlags: sets each flag's default from
// `prefix` + NAME when that variable is set.
void FlagDefaultsFromEnvironment(const std::string& prefix, const std::vector<std::string>& flags);

}  // namespace tessel
