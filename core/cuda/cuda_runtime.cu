#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/cuda_runtime.h"
#include "core/error.h"
#include "core/philox.h"

namespace tessel {

namespace {

void CheckCuda(cudaError_t err, const char* what) {
  TESSEL_CHECK_CODE(err == cudaSuccess, StatusCode::kUnavailable)
      << what << " failed: " << cudaGetErrorString(err) << " (" << static_cast<int>(err) << ")";
}

class CudaAllocator final : public CachingAllocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  Device device() const override { return Device::CUDA(index_); }

 protected:
  void* SystemAllocate(size_t bytes) override {
    CheckCuda(cudaSetDevice(index_), "cudaSetDevice");
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky OOM so the caller can retry
      return nullptr;
    }
    return ptr;
  }
  void SystemFree(void* ptr) override { cudaFree(ptr); }

 private:
  int index_;
};

__global__ void PhiloxUniformKernel(float* out, int64_t n, uint32_t k0, uint32_t k1, uint64_t offset) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint64_t pos = offset + static_cast<uint64_t>(i);
  uint64_t block = pos / 4;
  uint32_t c[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0};
  PhiloxRounds10(c, k0, k1);
  out[i] = PhiloxBitsToUniform(c[pos % 4]);
}

}  // namespace

Allocator* GetCudaAllocator(int index) {
  int count = cuda::DeviceCount();
  TESSEL_CHECK_CODE(index < count, StatusCode::kUnavailable)
      << "device cuda:" << index << " requested but " << count << " CUDA device(s) are visible";
  static std::mutex mu;
  static std::map<int, std::unique_ptr<CudaAllocator>>* allocators =
      new std::map<int, std::unique_ptr<CudaAllocator>>();  // lives for the process
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*allocators)[index];
  if (!slot) slot = std::make_unique<CudaAllocator>(index);
  return slot.get();
}

void CudaCopyBytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                   size_t bytes) {
  cudaMemcpyKind kind = dst_device.is_cpu()   ? cudaMemcpyDeviceToHost
                        : src_device.is_cpu() ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToDevice;
  CheckCuda(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}

namespace cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void PhiloxUniform(float* device_out, int64_t n, uint64_t seed, uint64_t offset, int index) {
  if (n == 0) return;
  CheckCuda(cudaSetDevice(index), "cudaSetDevice");
  constexpr int kThreads = 256;
  int64_t blocks = (n + kThreads - 1) / kThreads;
  PhiloxUniformKernel<<<static_cast<unsigned>(blocks), kThreads>>>(device_out, n, static_cast<uint32_t>(seed),
                                                                   static_cast<uint32_t>(seed >> 32), offset);
  CheckCuda(cudaGetLastError(), "PhiloxUniformKernel launch");
  CheckCuda(cudaDeviceSynchronize(), "PhiloxUniformKernel");
}

void Synchronize() { CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

namespace {
// Pooled events by device (an event belongs to the device it was made on),
// and the device of each event handed out.
std::mutex event_pool_mu;
std::map<int, std::vector<cudaEvent_t>>* event_pools = new std::map<int, std::vector<cudaEvent_t>>();
std::map<cudaEvent_t, int>* event_devices = new std::map<cudaEvent_t, int>();
}  // namespace

void* RecordEvent(int index) {
  int previous = 0;
  CheckCuda(cudaGetDevice(&previous), "cudaGetDevice");
  if (previous != index) CheckCuda(cudaSetDevice(index), "cudaSetDevice");
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(event_pool_mu);
    std::vector<cudaEvent_t>& pool = (*event_pools)[index];
    if (!pool.empty()) {
      event = pool.back();
      pool.pop_back();
    }
  }
  cudaError_t status = cudaSuccess;
  if (event == nullptr) status = cudaEventCreate(&event);
  if (status == cudaSuccess) status = cudaEventRecord(event, nullptr);  // the legacy stream the kernels use
  if (previous != index) cudaSetDevice(previous);  // the kernels' device stays the thread's
  CheckCuda(status, "cudaEventRecord");
  std::lock_guard<std::mutex> lock(event_pool_mu);
  (*event_devices)[event] = index;
  return event;
}

bool EventDone(void* event) {
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  return true;  // done, or an error ElapsedMs reports
}

float ElapsedMs(void* start, void* end) {
  const auto a = static_cast<cudaEvent_t>(start), b = static_cast<cudaEvent_t>(end);
  float ms = -1;
  if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    cudaGetLastError();
    DropEvent(start);
    DropEvent(end);
    return -1;
  }
  std::lock_guard<std::mutex> lock(event_pool_mu);
  for (cudaEvent_t e : {a, b}) {
    auto it = event_devices->find(e);
    (*event_pools)[it == event_devices->end() ? 0 : it->second].push_back(e);
    if (it != event_devices->end()) event_devices->erase(it);
  }
  return ms;
}

void DropEvent(void* event) {
  cudaEventDestroy(static_cast<cudaEvent_t>(event));
  cudaGetLastError();
  std::lock_guard<std::mutex> lock(event_pool_mu);
  event_devices->erase(static_cast<cudaEvent_t>(event));
}

}  // namespace cuda
}  // namespace tessel
