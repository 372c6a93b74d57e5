// The GEMM shapes every matmul benchmark measures, so tessel and its peers
// time the same work. GPT-2 small: 8 x 512 tokens, hidden 768, MLP 3072.
#pragma once

#include <cstdint>

namespace tessel::bench {

struct GemmShape {
  const char* name;
  int64_t m, n, k;
};

inline constexpr GemmShape kGemmShapes[] = {
    {"1024^3", 1024, 1024, 1024},
    {"2048^3", 2048, 2048, 2048},
    {"gpt2-small mlp up (4096x768 @ 768x3072)", 4096, 3072, 768},
    {"gpt2-small qkv (4096x768 @ 768x2304)", 4096, 2304, 768},
};

}  // namespace tessel::bench
