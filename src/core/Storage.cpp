#include "strata/core/Storage.h"

#include <cstring>
#include <tuple>

#include "core/cuda/CudaContext.h"
#include "strata/core/Error.h"

namespace strata {

StorageImpl::StorageImpl(size_t bytes, Allocator& allocator)
    : bytes_(bytes), device_(allocator.device()), owner_(&allocator) {
  data_ = bytes > 0 ? allocator.allocate(bytes) : nullptr;
}

StorageImpl::StorageImpl(void* data, size_t bytes, Device device)
    : data_(data), bytes_(bytes), device_(device) {}

StorageImpl::~StorageImpl() {
  releaseOwned();
}

void* StorageImpl::data() const {
  if (!resident()) failNotResident(0, bytes_);
  return data_;
}

void StorageImpl::failNotResident(size_t begin, size_t end) const {
  // The owner's message is about the user's code (which parameter it touched, and how to touch it).
  if (notResidentMessage_) STRATA_USER_FAIL("{}", notResidentMessage_(begin, end));
  STRATA_FAIL("storage '{}' ({} bytes) is not resident: gather its chunk first",
              label_.empty() ? std::string("<unnamed>") : label_, bytes_);
}

void StorageImpl::releaseOwned() {
  if (owner_ && data_) owner_->deallocate(data_);
  owner_ = nullptr;
}

// Moves never bump version_: see NOTE [Content version and residency].
void StorageImpl::repoint(void* data, Device device) {
  releaseOwned();
  data_ = data;
  device_ = device;
  ++residencyVersion_;
}

void StorageImpl::evict() {
  releaseOwned();
  data_ = nullptr;
  ++residencyVersion_;
}

void StorageImpl::recordStream(const Stream& stream) {
  if (owner_ && data_) owner_->recordStream(data_, stream);
}

Storage makeStorage(size_t bytes, Device device) {
  return std::make_shared<StorageImpl>(bytes, deviceAllocator(device));
}

void copyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes) {
  if (bytes == 0) return;
  if (dstDevice.isCpu() && srcDevice.isCpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if STRATA_CUDA
  Device gpu = dstDevice.isCuda() ? dstDevice : srcDevice;
  cuda::DeviceGuard guard(gpu.index);
  Stream stream = currentStream(gpu);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::nativeStream(stream)));
  stream.synchronize();
#else
  STRATA_FAIL("copy between {} and {} needs a CUDA build", toString(srcDevice), toString(dstDevice));
#endif
}

void copyAsync(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes,
               const Stream& stream) {
  if (dstDevice.isCpu() && srcDevice.isCpu()) {
    STRATA_CHECK(stream.device().isCpu(),
                 "copyAsync: a copy between two host buffers runs on a CPU stream, not on one of {}",
                 toString(stream.device()));
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return;
  }
  STRATA_CHECK(stream.device().isCuda() && (stream.device() == dstDevice || stream.device() == srcDevice),
               "copyAsync: a copy from {} to {} is ordered on a stream of the GPU involved, not on one of {}",
               toString(srcDevice), toString(dstDevice), toString(stream.device()));
  if (bytes == 0) return;
#if STRATA_CUDA
  for (auto [ptr, device, role] : {std::tuple{static_cast<const void*>(dst), dstDevice, "destination"},
                                   std::tuple{src, srcDevice, "source"}}) {
    STRATA_CHECK(device.isCuda() || isPageLocked(ptr, bytes),
                 "copyAsync: the host {} ({} bytes at {}) is pageable memory, which CUDA would copy "
                 "synchronously; stage it in pinned memory (a PinnedHostPool) or use copyBytes",
                 role, bytes, ptr);
  }
  cuda::DeviceGuard guard(stream.device().index);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda::nativeStream(stream)));
#else
  STRATA_FAIL("copy between {} and {} needs a CUDA build", toString(srcDevice), toString(dstDevice));
#endif
}

}  // namespace strata
