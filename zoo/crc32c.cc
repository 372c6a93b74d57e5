#include "zoo/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace tessel::zoo {

void Crc32cAccumulator::Update(const void* data, size_t bytes) {
  // ISA-L takes an int length: larger buffers go in parts.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    const size_t part = std::min<size_t>(bytes, size_t{1} << 30);
    state_ = crc32_iscsi(p, static_cast<int>(part), state_);
    p += part;
    bytes -= part;
  }
}

uint32_t Crc32c(std::string_view bytes) {
  Crc32cAccumulator crc;
  crc.Update(bytes.data(), bytes.size());
  return crc.value();
}

}  // namespace tessel::zoo
