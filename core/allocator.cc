#include "core/allocator.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>

#include "core/error.h"

namespace tessel {

#ifdef TESSEL_HAS_CUDA
Allocator* GetCudaAllocator(int index);  // core/cuda/cuda_allocator.cu
#endif

Allocator* GetAllocator(const Device& device) {
  if (device.is_cpu()) {
    static CpuAllocator* cpu = new CpuAllocator();  // lives for the process
    return cpu;
  }
#ifdef TESSEL_HAS_CUDA
  return GetCudaAllocator(device.index());
#else
  TESSEL_THROW(StatusCode::kUnavailable)
      << "device " << device << " requested but tessel was built without CUDA "
      << "(configure with nvcc present and TESSEL_WITH_CUDA=ON)";
#endif
}

size_t CachingAllocator::RoundToSizeClass(size_t bytes) {
  constexpr size_t kMiB = 1 << 20;
  if (bytes <= 512) return 512;
  if (bytes < kMiB) return std::bit_ceil(bytes);
  return (bytes + kMiB - 1) / kMiB * kMiB;
}

CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::Allocate(size_t bytes) {
  size_t size = RoundToSizeClass(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_blocks_.find(size);
    if (it != free_blocks_.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= static_cast<int64_t>(size);
      stats_.allocated_bytes += static_cast<int64_t>(size);
      stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
      ++stats_.num_cache_hits;
      return ptr;
    }
  }
  void* ptr = SystemAllocate(size);
  if (ptr == nullptr) {
    // Out of memory: give the cache back and try once more before failing.
    EmptyCache();
    ptr = SystemAllocate(size);
  }
  TESSEL_CHECK_CODE(ptr != nullptr, StatusCode::kUnavailable)
      << "out of memory on " << device() << " allocating " << bytes << " bytes (size class " << size << "); "
      << stats().allocated_bytes << " bytes already allocated";
  std::lock_guard<std::mutex> lock(mu_);
  stats_.allocated_bytes += static_cast<int64_t>(size);
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.num_system_allocs;
  return ptr;
}

void CachingAllocator::Free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  size_t size = RoundToSizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_blocks_[size].push_back(ptr);
  stats_.allocated_bytes -= static_cast<int64_t>(size);
  stats_.cached_bytes += static_cast<int64_t>(size);
}

void CachingAllocator::EmptyCache() {
  std::map<size_t, std::vector<void*>> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_blocks_);
    stats_.cached_bytes = 0;
  }
  for (auto& [size, ptrs] : blocks) {
    for (void* p : ptrs) SystemFree(p);
  }
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void* CpuAllocator::SystemAllocate(size_t bytes) {
  return std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
}

void CpuAllocator::SystemFree(void* ptr) { std::free(ptr); }

}  // namespace tessel
