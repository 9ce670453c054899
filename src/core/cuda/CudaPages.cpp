// PageMemory over CUDA's virtual memory management (NOTE [Expandable segments] in
// core/ExpandableAllocator.h).
#include <cuda.h>  // the driver's types only: its functions are looked up at run time, libcuda is not linked

#include <algorithm>
#include <memory>

#include "core/cuda/CudaContext.h"

namespace strata::cuda {

namespace {

struct Driver {
  decltype(&cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) addressReserve = nullptr;
  decltype(&cuMemAddressFree) addressFree = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemSetAccess) setAccess = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemRelease) release = nullptr;
};

template <typename F>
bool lookUp(const char* symbol, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();
    return false;
  }
  fn = reinterpret_cast<F>(p);
  return true;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) STRATA_FAIL("CUDA driver error {} in {}", int(r), what);
}

}  // namespace

std::optional<PageMemory> devicePages(int index, std::string& why) {
  auto d = std::make_shared<Driver>();
  if (!lookUp("cuDeviceGetAttribute", d->deviceGetAttribute) ||
      !lookUp("cuMemGetAllocationGranularity", d->granularity) ||
      !lookUp("cuMemAddressReserve", d->addressReserve) || !lookUp("cuMemAddressFree", d->addressFree) ||
      !lookUp("cuMemCreate", d->create) || !lookUp("cuMemMap", d->map) ||
      !lookUp("cuMemSetAccess", d->setAccess) || !lookUp("cuMemUnmap", d->unmap) ||
      !lookUp("cuMemRelease", d->release)) {
    why = "the driver does not export the virtual memory management functions";
    return std::nullopt;
  }
  DeviceGuard guard(index);
  int supported = 0;
  if (d->deviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, index) !=
          CUDA_SUCCESS ||
      !supported) {
    why = "the GPU does not support virtual memory management";
    return std::nullopt;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = index;
  size_t granularity = 0;
  check(d->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  constexpr size_t kPage = size_t(2) << 20;
  size_t page = (std::max(granularity, kPage) + granularity - 1) / granularity * granularity;

  PageMemory pages;
  pages.pageBytes = page;
  pages.reserve = [d, page](size_t bytes) -> void* {
    CUdeviceptr base = 0;
    if (d->addressReserve(&base, bytes, page, 0, 0) != CUDA_SUCCESS) return nullptr;
    return reinterpret_cast<void*>(base);
  };
  pages.unreserve = [d](void* base, size_t bytes) { d->addressFree(CUdeviceptr(base), bytes); };
  pages.map = [d, page, prop, index](void* at, size_t bytes) -> bool {
    DeviceGuard guard(index);
    CUdeviceptr base = CUdeviceptr(at);
    size_t mapped = 0;
    auto undo = [&] {
      for (size_t off = 0; off < mapped; off += page) d->unmap(base + off, page);
      return false;
    };
    for (; mapped < bytes; mapped += page) {
      CUmemGenericAllocationHandle handle{};
      // Out of memory (or any refusal to create) is the caller's to handle: nothing stays mapped.
      if (d->create(&handle, page, &prop, 0) != CUDA_SUCCESS) return undo();
      CUresult r = d->map(base + mapped, page, 0, handle, 0);
      // The mapping holds the memory from here on; unmapping gives it back.
      d->release(handle);
      if (r != CUDA_SUCCESS) return undo();
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d->setAccess(base, bytes, &access, 1) != CUDA_SUCCESS) return undo();
    return true;
  };
  pages.unmap = [d, page](void* at, size_t bytes) {
    CUdeviceptr base = CUdeviceptr(at);
    for (size_t off = 0; off < bytes; off += page) check(d->unmap(base + off, page), "cuMemUnmap");
  };
  pages.synchronize = [index] {
    DeviceGuard guard(index);
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  };
  return pages;
}

}  // namespace strata::cuda
