// Private CUDA plumbing of the core layer: status checks and the per-device context (allocator, streams).
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "strata/core/Allocator.h"
#include "strata/core/Error.h"
#include "strata/core/ExpandableAllocator.h"
#include "strata/core/Stream.h"

#if STRATA_CUDA
#include <cuda_runtime.h>

#define STRATA_CUDA_CHECK(expr)                                                           \
  do {                                                                                    \
    cudaError_t strata_status_ = (expr);                                                  \
    if (strata_status_ != cudaSuccess) {                                                  \
      ::strata::detail::throwError(                                                       \
          __FILE__, __LINE__, #expr,                                                      \
          ::strata::detail::format("CUDA error {}: {}", cudaGetErrorName(strata_status_), \
                                   cudaGetErrorString(strata_status_)));                  \
    }                                                                                     \
  } while (0)

// After every kernel launch.
#define STRATA_CUDA_CHECK_LAUNCH() STRATA_CUDA_CHECK(cudaGetLastError())

namespace strata::cuda {

struct DeviceContext {
  int index = 0;
  CachingAllocator* allocator = nullptr;
  DeviceStreams streams;
};

// Created on first use, one per GPU, alive for the process (like the CUDA primary context it wraps). Its
// allocator is an ExpandableAllocator over devicePages, or, with STRATA_CUDA_ALLOCATOR=blocks or where the
// GPU lacks virtual memory management, a BlockCachingAllocator over cudaMalloc.
DeviceContext& deviceContext(int index);

// The GPU's memory as pages in reserved address space; nullopt, with the reason in `why`, where the driver or
// the GPU lacks virtual memory management.
std::optional<PageMemory> devicePages(int index, std::string& why);

// Sets the current CUDA device for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();

 private:
  int previous_ = 0;
  bool changed_ = false;
};

inline cudaStream_t nativeStream(const Stream& s) {
  return static_cast<cudaStream_t>(s.native());
}

}  // namespace strata::cuda
#endif
