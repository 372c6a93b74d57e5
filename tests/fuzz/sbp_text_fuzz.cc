// The text forms users type: "S(0)", "[S(0), B]", "cpu:[[0,1],[2,3]]".
// Bad text must throw tessel::Error, nothing else; good text must print
// back to a form that parses to the same value.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    tessel::Sbp sbp = tessel::Sbp::Parse(text);
    if (!(tessel::Sbp::Parse(sbp.ToString()) == sbp)) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  try {
    tessel::NdSbp nd = tessel::NdSbp::Parse(text);
    if (!(tessel::NdSbp::Parse(nd.ToString()) == nd)) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  try {
    tessel::Placement p = tessel::Placement::Parse(text);
    if (!(tessel::Placement::Parse(p.ToString()) == p)) __builtin_trap();
  } catch (const tessel::Error&) {
  }
  return 0;
}
