// What users of other trainers type (Megatron-LM's and torchrun's flags),
// and how tessel says it: tessel-train's flag check and the config's
// unknown-field message both point there, so `--log-interval` on the
// command line and `log_interval` in a config both name train.log_period.
#pragma once

#include <string>

namespace tessel::zoo {

// The tessel way of saying `name` (a flag or field name, with dashes or
// underscores), e.g. "--set train.log_period=N"; empty if it is not
// another trainer's setting that tessel knows.
std::string ForeignSettingInstead(const std::string& name);

}  // namespace tessel::zoo
