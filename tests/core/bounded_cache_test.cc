#include "core/bounded_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace tessel {
namespace {

TEST(BoundedCache, EvictsTheLeastRecentlyUsed) {
  BoundedCache<std::string, int> cache(2);
  cache.Put("a", 1);
  cache.Put("b", 2);
  ASSERT_EQ(cache.Get("a"), 1);  // "a" is now the most recent
  cache.Put("c", 3);             // evicts "b"
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_FALSE(cache.Get("b").has_value());
  EXPECT_EQ(cache.Get("a"), 1);
  EXPECT_EQ(cache.Get("c"), 3);
  cache.Put("c", 4);  // replacing does not grow it
  EXPECT_EQ(cache.Get("c"), 4);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(BoundedCache, NeverExceedsItsCapacityUnderConcurrentUse) {
  BoundedCache<int, int> cache(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 5000; ++i) {
        cache.Put(t * 100000 + i, i);
        (void)cache.Get(t * 100000 + i / 2);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cache.size(), 64u);
  EXPECT_EQ(cache.evictions(), 4u * 5000 - 64);
}

}  // namespace
}  // namespace tessel
