// Training configs (protobuf text): any text must parse and resolve or throw
// tessel::Error; a resolved config prints back to text that parses to the
// same message.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "zoo/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 8192) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    tessel::config::Config config = tessel::zoo::ParseConfig(text, "fuzz.prototxt");
    tessel::zoo::ResolveConfig(&config, 4);
    tessel::config::Config again = tessel::zoo::ParseConfig(tessel::zoo::ConfigText(config), "resolved");
    if (again.SerializeAsString() != config.SerializeAsString()) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
