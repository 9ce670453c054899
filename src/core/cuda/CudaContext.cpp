#include "core/cuda/CudaContext.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

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
    const char* choice = std::getenv("STRATA_CUDA_ALLOCATOR");
    std::string kind = choice && *choice ? choice : "expandable";
    STRATA_USER_CHECK(kind == "expandable" || kind == "blocks",
                      "STRATA_CUDA_ALLOCATOR={} is not an allocator: use expandable (the default) or blocks",
                      kind);
    std::string name = "cuda:" + std::to_string(index);
    std::string why;
    std::optional<PageMemory> pages = kind == "expandable" ? devicePages(index, why) : std::nullopt;
    // Leaked on purpose: tensors may be destroyed during static destruction, after this map would be.
    if (pages) {
      size_t freeBytes = 0, totalBytes = 0;
      STRATA_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
      ExpandableAllocatorOptions options;
      options.segmentBytes = totalBytes;
      slot->allocator = new ExpandableAllocator(Device::cuda(index), std::move(*pages), name, options);
    } else {
      if (kind == "expandable")
        spdlog::warn("{}: {}; blocks are cached whole (STRATA_CUDA_ALLOCATOR=blocks)", name, why);
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
      slot->allocator = new BlockCachingAllocator(Device::cuda(index), std::move(raw), name);
    }
    slot->streams = DeviceStreams::create(Device::cuda(index));
  }
  return *slot;
}

}  // namespace strata::cuda
