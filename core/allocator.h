// Memory allocators. Every device type has one process-wide allocator; the
// CPU one caches freed blocks by size class so the training loop's repeated
// allocations of the same sizes do not go back to the OS each step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/device.h"

namespace tessel {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // handed out and not yet freed (size-class rounded)
  int64_t cached_bytes = 0;     // freed blocks held for reuse
  int64_t peak_allocated_bytes = 0;
  int64_t num_system_allocs = 0;  // calls that reached the OS / driver
  int64_t num_cache_hits = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr, size_t bytes) = 0;
  // Returns every cached block to the system.
  virtual void EmptyCache() = 0;
  virtual AllocatorStats stats() const = 0;
  // Starts a new peak: peak_allocated_bytes becomes allocated_bytes (how a
  // caller measures the working memory of one piece of work).
  virtual void ResetPeak() = 0;
  virtual Device device() const = 0;
};

// The allocator for `device`; CUDA devices need the CUDA backend.
Allocator* GetAllocator(const Device& device);

// A size-class caching allocator over raw system allocations. Size classes
// are powers of two below 1 MiB and multiples of 1 MiB above, so a cached
// block never wastes more than half (small) or 1 MiB (large) of itself.
class CachingAllocator : public Allocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator() override;
  void* Allocate(size_t bytes) override;
  void Free(void* ptr, size_t bytes) override;
  void EmptyCache() override;
  AllocatorStats stats() const override;
  void ResetPeak() override;

  static size_t RoundToSizeClass(size_t bytes);

 protected:
  virtual void* SystemAllocate(size_t bytes) = 0;
  virtual void SystemFree(void* ptr) = 0;

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_blocks_;
  AllocatorStats stats_;
};

class CpuAllocator final : public CachingAllocator {
 public:
  // 64-byte alignment keeps AVX-512 loads aligned.
  static constexpr size_t kAlignment = 64;
  ~CpuAllocator() override { EmptyCache(); }
  Device device() const override { return Device::CPU(); }

 protected:
  void* SystemAllocate(size_t bytes) override;
  void SystemFree(void* ptr) override;
};

}  // namespace tessel
