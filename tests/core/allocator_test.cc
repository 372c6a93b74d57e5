#include "core/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace tessel {
namespace {

TEST(Allocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundToSizeClass(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundToSizeClass(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundToSizeClass(5000), 8192u);
  EXPECT_EQ(CachingAllocator::RoundToSizeClass((1 << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::RoundToSizeClass(3u << 20), 3u << 20);
}

TEST(Allocator, ReusesFreedBlocksAndAligns) {
  CpuAllocator alloc;
  void* a = alloc.Allocate(3000);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % CpuAllocator::kAlignment, 0u);
  std::memset(a, 1, 3000);
  EXPECT_EQ(alloc.stats().allocated_bytes, 4096);
  alloc.Free(a, 3000);
  EXPECT_EQ(alloc.stats().allocated_bytes, 0);
  EXPECT_EQ(alloc.stats().cached_bytes, 4096);
  // Same size class: the cached block comes back without a system call.
  void* b = alloc.Allocate(4000);
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.stats().num_cache_hits, 1);
  EXPECT_EQ(alloc.stats().num_system_allocs, 1);
  void* c = alloc.Allocate(100);
  EXPECT_EQ(alloc.stats().num_system_allocs, 2);
  EXPECT_EQ(alloc.stats().peak_allocated_bytes, 4096 + 512);
  alloc.Free(b, 4000);
  alloc.Free(c, 100);
  alloc.EmptyCache();
  EXPECT_EQ(alloc.stats().cached_bytes, 0);
}

TEST(Allocator, CpuDeviceAllocatorIsShared) {
  EXPECT_EQ(GetAllocator(Device::CPU()), GetAllocator(Device::CPU()));
  EXPECT_EQ(GetAllocator(Device::CPU())->device(), Device::CPU());
}

}  // namespace
}  // namespace tessel
