#include "core/philox.h"

#include <cmath>
#include <numbers>

namespace tessel {

Philox::Counter Philox::Rounds10(Counter c, Key k) {
  PhiloxRounds10(c.data(), k[0], k[1]);
  return c;
}

Philox::Counter Philox::Block(uint64_t block) const {
  return Rounds10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0}, key_);
}

float Philox::Normal(uint64_t offset) const {
  // Lanes (0,1) and (2,3) of a block form Box-Muller pairs; lane parity picks
  // cos or sin so paired elements stay independent standard normals.
  Counter c = Block(offset / 4);
  uint32_t lane = offset % 4;
  uint32_t pair = lane & ~1u;
  // u1 in (0, 1] so log never sees zero.
  float u1 = (static_cast<float>(c[pair] >> 8) + 1.0f) * (1.0f / 16777216.0f);
  float u2 = ToUniform(c[pair + 1]);
  float r = std::sqrt(-2.0f * std::log(u1));
  float theta = 2.0f * std::numbers::pi_v<float> * u2;
  return (lane & 1u) ? r * std::sin(theta) : r * std::cos(theta);
}

void Philox::FillUniform(float* out, int64_t n, uint64_t offset) const {
  int64_t i = 0;
  while (i < n) {
    uint64_t pos = offset + static_cast<uint64_t>(i);
    Counter c = Block(pos / 4);
    for (uint32_t lane = pos % 4; lane < 4 && i < n; ++lane, ++i) out[i] = ToUniform(c[lane]);
  }
}

void Philox::FillNormal(float* out, int64_t n, uint64_t offset) const {
  for (int64_t i = 0; i < n; ++i) out[i] = Normal(offset + static_cast<uint64_t>(i));
}

}  // namespace tessel
