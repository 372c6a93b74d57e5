// The header of a safetensors file (checkpoints, image datasets): any bytes
// must parse or throw tessel::Error, never read past the buffer or allocate
// by the header's shapes; a parsed header's byte ranges lie in the buffer.
#include <cstdint>

#include "core/error.h"
#include "zoo/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tessel::zoo::SafetensorsHeader header = tessel::zoo::ParseSafetensorsHeader(data, size, "fuzz");
    for (const auto& [name, entry] : header.entries) {
      if (header.data_offset + entry.end > size || entry.begin > entry.end) __builtin_trap();
      if (entry.end > entry.begin && data[header.data_offset + entry.end - 1] == 0xfe) continue;  // readable
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
