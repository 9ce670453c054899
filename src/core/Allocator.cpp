#include "strata/core/Allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/cuda/CudaContext.h"
#include "strata/core/Error.h"

namespace strata {
namespace {

constexpr size_t kCpuAlignment = 64;

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    STRATA_CHECK(p != nullptr, "host allocation of {} bytes failed", bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[p] = rounded;
    stats_.allocatedBytes += rounded;
    stats_.reservedBytes += rounded;
    stats_.numAllocations++;
    stats_.numRawAllocations++;
    stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
    stats_.peakReservedBytes = stats_.peakAllocatedBytes;
    return p;
  }
  void deallocate(void* ptr) override {
    if (!ptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(ptr);
      STRATA_CHECK(it != sizes_.end(), "cpu allocator: freeing a pointer it did not allocate");
      stats_.allocatedBytes -= it->second;
      stats_.reservedBytes -= it->second;
      sizes_.erase(it);
    }
    std::free(ptr);
  }
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  std::string name() const override { return "cpu"; }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  AllocatorStats stats_;
};

RawMemory alignedHostMemory() {
  return RawMemory{[](size_t bytes) { return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096); },
                   [](void* p) { std::free(p); }};
}

}  // namespace

Allocator& cpuAllocator() {
  static CpuAllocator* allocator = new CpuAllocator();  // never destroyed: outlives every static tensor
  return *allocator;
}

Allocator& deviceAllocator(Device device) {
  if (device.isCpu()) return cpuAllocator();
#if STRATA_CUDA
  return *cuda::deviceContext(device.index).allocator;
#else
  STRATA_FAIL("device {} requested, but this build of Strata has no CUDA support", toString(device));
#endif
}

// ---- CachingAllocator
// ---------------------------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Device device, RawMemory raw, std::string name)
    : device_(device), raw_(std::move(raw)), name_(std::move(name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  releaseCachedLocked();
}

size_t CachingAllocator::roundSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  bytes = std::max<size_t>(bytes, 1);
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t bytes) {
  size_t size = roundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.numAllocations++;
  // Best fit among cached blocks, but never hand out a block more than twice the request: that would strand
  // memory.
  auto it = freeBlocks_.lower_bound(size);
  if (it != freeBlocks_.end() && it->first <= 2 * size) {
    void* p = it->second;
    size_t blockSize = it->first;
    freeBlocks_.erase(it);
    liveBlocks_[p] = blockSize;
    stats_.allocatedBytes += blockSize;
    stats_.numCacheHits++;
    stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
    return p;
  }
  void* p = raw_.alloc(size);
  if (!p) {
    // Out of memory: give the cache back and try once more before failing.
    releaseCachedLocked();
    p = raw_.alloc(size);
  }
  STRATA_CHECK(p != nullptr, "{}: out of memory allocating {} bytes ({} allocated, {} reserved)", name_, size,
               stats_.allocatedBytes, stats_.reservedBytes);
  liveBlocks_[p] = size;
  stats_.numRawAllocations++;
  stats_.allocatedBytes += size;
  stats_.reservedBytes += size;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  return p;
}

void CachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = liveBlocks_.find(ptr);
  STRATA_CHECK(it != liveBlocks_.end(), "{}: freeing a pointer it did not allocate", name_);
  stats_.allocatedBytes -= it->second;
  freeBlocks_.emplace(it->second, ptr);
  liveBlocks_.erase(it);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  releaseCachedLocked();
}

bool CachingAllocator::hasCachedFit(size_t bytes) const {
  size_t size = roundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = freeBlocks_.lower_bound(size);
  return it != freeBlocks_.end() && it->first <= 2 * size;
}

void CachingAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
  stats_.peakReservedBytes = stats_.reservedBytes;
}

void CachingAllocator::releaseCachedLocked() {
  for (auto& [size, ptr] : freeBlocks_) {
    raw_.free(ptr);
    stats_.reservedBytes -= size;
  }
  freeBlocks_.clear();
}

// ---- PinnedHostPool
// -----------------------------------------------------------------------------------------------

namespace {
RawMemory pinnedOrAligned(bool& pageLocked) {
#if STRATA_CUDA
  if (cudaAvailable()) {
    pageLocked = true;
    return RawMemory{[](size_t bytes) -> void* {
                       void* p = nullptr;
                       if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
                         cudaGetLastError();
                         return nullptr;
                       }
                       return p;
                     },
                     [](void* p) { cudaFreeHost(p); }};
  }
#endif
  pageLocked = false;
  return alignedHostMemory();
}
}  // namespace

PinnedHostPool::PinnedHostPool(size_t capacityBytes)
    : capacity_(capacityBytes), cache_(Device::cpu(), pinnedOrAligned(pageLocked_), "pinned-host-pool") {}

PinnedHostPool::PinnedHostPool(size_t capacityBytes, RawMemory raw)
    : capacity_(capacityBytes), cache_(Device::cpu(), std::move(raw), "pinned-host-pool") {}

PinnedHostPool::~PinnedHostPool() = default;

void* PinnedHostPool::allocate(size_t bytes) {
  size_t size = CachingAllocator::roundSize(bytes);
  AllocatorStats s = cache_.stats();
  STRATA_CHECK(
      s.allocatedBytes + size <= capacity_,
      "pinned host pool exhausted: {} bytes requested, {} of {} bytes in use; raise the pool capacity "
      "(zero_optimization.buffer_count or store.host_budget_gb) or free staging buffers",
      bytes, s.allocatedBytes, capacity_);
  // Growing past the capacity: trade the cached blocks for the new size.
  if (!cache_.hasCachedFit(bytes) && s.reservedBytes + size > capacity_) cache_.emptyCache();
  return cache_.allocate(bytes);
}

void PinnedHostPool::deallocate(void* ptr) {
  cache_.deallocate(ptr);
}

AllocatorStats PinnedHostPool::stats() const {
  return cache_.stats();
}

// ---- SlotArena
// ----------------------------------------------------------------------------------------------------

SlotArena::SlotArena(Allocator& backing, size_t slotBytes, size_t numSlots)
    : backing_(backing),
      slotBytes_((slotBytes + 255) / 256 * 256),
      numSlots_(numSlots),
      inUse_(numSlots, false) {
  STRATA_CHECK(slotBytes > 0 && numSlots > 0, "slot arena needs a positive slot size and count");
  base_ = static_cast<char*>(backing_.allocate(slotBytes_ * numSlots_));
  free_.reserve(numSlots_);
  for (size_t i = numSlots_; i-- > 0;) free_.push_back(int(i));  // acquire() hands out slot 0 first
}

SlotArena::~SlotArena() {
  backing_.deallocate(base_);
}

int SlotArena::acquire() {
  if (free_.empty()) return -1;
  int slot = free_.back();
  free_.pop_back();
  inUse_[size_t(slot)] = true;
  return slot;
}

void SlotArena::release(int slot) {
  STRATA_CHECK(slot >= 0 && size_t(slot) < numSlots_, "slot {} out of range (arena has {})", slot, numSlots_);
  STRATA_CHECK(inUse_[size_t(slot)], "slot {} released twice", slot);
  inUse_[size_t(slot)] = false;
  free_.push_back(slot);
}

void* SlotArena::slotData(int slot) const {
  STRATA_CHECK(slot >= 0 && size_t(slot) < numSlots_, "slot {} out of range (arena has {})", slot, numSlots_);
  return base_ + size_t(slot) * slotBytes_;
}

}  // namespace strata
