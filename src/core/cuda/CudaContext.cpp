#include "core/cuda/CudaContext.h"

#include <memory>
#include <mutex>
#include <vector>

#include "strata/core/Device.h"

namespace strata::cuda {

DeviceGuard::DeviceGuard(int index) {
  // NOTE [Process device]: a fresh thread takes the process's GPU first, so the guard restores that one.
  bindThreadToProcessDevice();
  STRATA_CUDA_CHECK(cudaGetDevice(&previous_));
  changed_ = previous_ != index;
  if (changed_) STRATA_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(previous_);
}

DeviceContext& deviceContext(int index) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceContext>> contexts;
  std::lock_guard<std::mutex> lock(mutex);
  int count = cudaDeviceCount();
  STRATA_CHECK(index >= 0 && index < count, "cuda:{} requested but {} CUDA device(s) are visible", index,
               count);
  if (contexts.empty()) contexts.resize(size_t(count));
  auto& slot = contexts[size_t(index)];
  if (!slot) {
    DeviceGuard guard(index);
    slot = std::make_unique<DeviceContext>();
    slot->index = index;
    RawMemory raw{[index](size_t bytes) -> void* {
                    DeviceGuard g(index);
                    void* p = nullptr;
                    if (cudaMalloc(&p, bytes) != cudaSuccess) {
                      cudaGetLastError();
                      return nullptr;
                    }
                    return p;
                  },
                  [index](void* p) {
                    DeviceGuard g(index);
                    cudaFree(p);
                  }};
    // Leaked on purpose: tensors may be destroyed during static destruction, after this map would be.
    slot->allocator =
        new CachingAllocator(Device::cuda(index), std::move(raw), "cuda-caching:" + std::to_string(index));
    slot->streams = DeviceStreams::create(Device::cuda(index));
  }
  return *slot;
}

}  // namespace strata::cuda
