#include "core/half.h"

namespace tessel {

uint16_t Float16::FromFloat(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (mag < 0x38800000u) {
    // Subnormal half (or zero): scale so the half's unit is one, then round
    // to nearest even by letting float addition do it.
    float abs = std::bit_cast<float>(mag);
    float scaled = abs * 16777216.0f;  // 2^24: half subnormal ulp is 2^-24
    uint32_t r = static_cast<uint32_t>(scaled);
    float frac = scaled - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round mantissa 23 -> 10 bits.
  uint32_t rounded = mag + 0xfffu + ((mag >> 13) & 1u);
  rounded -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

float Float16::ToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace tessel
