// Philox-4x32-10 counter-based random numbers (Salmon et al., SC'11).
//
// A random value is a pure function of (seed, offset): element i of a random
// tensor draws from counter block i/4, lane i%4. This is what makes tessel's
// random init and dropout independent of how a tensor is split across ranks:
// each rank computes exactly the logical elements it owns.
#pragma once

#include <array>
#include <cstdint>

#ifdef __CUDACC__
#define TESSEL_HOST_DEVICE __host__ __device__
#else
#define TESSEL_HOST_DEVICE
#endif

namespace tessel {

// One Philox-4x32-10 evaluation in place: c (4 words) under key k (2 words).
// Shared by the CPU code and the CUDA kernels so both draw identical values.
TESSEL_HOST_DEVICE inline void PhiloxRounds10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c[0];
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c[2];
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = static_cast<uint32_t>(p1);
    c[2] = n2;
    c[3] = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;  // golden ratio
    k1 += 0xBB67AE85u;  // sqrt(3) - 1
  }
}

// Uniform [0, 1) from 32 random bits, using the top 24 (exact in f32).
TESSEL_HOST_DEVICE inline float PhiloxBitsToUniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

class Philox {
 public:
  using Counter = std::array<uint32_t, 4>;
  using Key = std::array<uint32_t, 2>;

  // The raw 10-round bijection on a 128-bit counter under a 64-bit key.
  static Counter Rounds10(Counter counter, Key key);

  explicit Philox(uint64_t seed) : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)} {}

  // Four 32-bit words for counter block `block` (elements 4*block .. 4*block+3).
  Counter Block(uint64_t block) const;
  // The 32 random bits of logical element `offset`.
  uint32_t Bits(uint64_t offset) const { return Block(offset / 4)[offset % 4]; }
  // Uniform in [0, 1) with 24 random bits, for element `offset`.
  float Uniform(uint64_t offset) const { return ToUniform(Bits(offset)); }
  // Standard normal for element `offset` (Box-Muller over the element's block
  // pair, so every element's value depends only on its own offset).
  float Normal(uint64_t offset) const;

  static float ToUniform(uint32_t bits) { return PhiloxBitsToUniform(bits); }
  uint64_t seed() const { return (static_cast<uint64_t>(key_[1]) << 32) | key_[0]; }

  // Fills out[i] = Uniform(offset + i) for i < n.
  void FillUniform(float* out, int64_t n, uint64_t offset) const;
  void FillNormal(float* out, int64_t n, uint64_t offset) const;

 private:
  Key key_;
};

}  // namespace tessel
