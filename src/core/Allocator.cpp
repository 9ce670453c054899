#include "strata/core/Allocator.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include "core/StreamUses.h"
#include "core/cuda/CudaContext.h"
#include "strata/core/Error.h"

namespace strata {

namespace {
thread_local const char* currentPurpose = nullptr;

std::string humanBytes(size_t bytes) {
  if (bytes >= (size_t(1) << 30)) return detail::format("{} GiB", double(bytes) / double(1ull << 30));
  return detail::format("{} MiB", double(bytes) / double(1ull << 20));
}
}  // namespace

OutOfMemory::OutOfMemory(const OutOfMemory& cause, const std::string& explanation)
    : Error(cause.message() + ": " + explanation, {}, /*userFacing=*/true),
      device_(cause.device_),
      bytes_(cause.bytes_),
      purpose_(cause.purpose_),
      figures_(cause.figures_) {}

MemoryPurpose::MemoryPurpose(const char* what) : previous_(currentPurpose) {
  currentPurpose = what;
}

MemoryPurpose::~MemoryPurpose() {
  currentPurpose = previous_;
}

const char* MemoryPurpose::current() {
  return currentPurpose;
}

OutOfMemory::OutOfMemory(const std::string& memory, Device device, size_t bytes, std::string figures)
    : Error(detail::format("out of memory: {} could not give {} ({} bytes){}", memory, humanBytes(bytes),
                           bytes, currentPurpose ? detail::format(" for {}", currentPurpose) : std::string()),
            /*location=*/{}, /*userFacing=*/true),
      device_(device),
      bytes_(bytes),
      purpose_(currentPurpose ? currentPurpose : ""),
      figures_(std::move(figures)) {}

namespace {

constexpr size_t kCpuAlignment = 64;

// The counters of an allocator that takes every block from the system (no cache: allocated == reserved).
void countFailure(AllocatorStats& stats) {
  stats.numRawFailures++;
  stats.numFailedAllocations++;
}
void countAllocation(AllocatorStats& stats, size_t bytes) {
  stats.allocatedBytes += bytes;
  stats.reservedBytes += bytes;
  stats.numAllocations++;
  stats.numRawAllocations++;
  stats.peakAllocatedBytes = std::max(stats.peakAllocatedBytes, stats.allocatedBytes);
  stats.peakReservedBytes = std::max(stats.peakReservedBytes, stats.reservedBytes);
}
void countFree(AllocatorStats& stats, size_t bytes) {
  stats.allocatedBytes -= bytes;
  stats.reservedBytes -= bytes;
}

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    std::lock_guard<std::mutex> lock(mutex_);
    if (p == nullptr) {
      countFailure(stats_);
      throw OutOfMemory("host memory", Device::cpu(), bytes, "aligned_alloc returned null");
    }
    sizes_[p] = rounded;
    countAllocation(stats_, rounded);
    return p;
  }
  void deallocate(void* ptr) override {
    if (!ptr) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(ptr);
      STRATA_CHECK(it != sizes_.end(), "cpu allocator: freeing a pointer it did not allocate");
      countFree(stats_, it->second);
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
  void resetPeakStats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peakAllocatedBytes = stats_.peakReservedBytes = stats_.allocatedBytes;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  AllocatorStats stats_;
};

// NOTE [Host state memory] in Allocator.h.
class HostStateAllocator final : public Allocator {
 public:
  explicit HostStateAllocator(bool pinned) : pinned_(pinned) {}
  void* allocate(size_t bytes) override {
    constexpr size_t kPage = 4096;
    size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(mutex_);
      countFailure(stats_);
    }
    if (p == MAP_FAILED)
      throw OutOfMemory("host memory for optimizer state", Device::cpu(), bytes,
                        detail::format("mmap: {}", std::strerror(errno)));
    bool locked = false;
#if STRATA_CUDA
    if (pinned_ && cudaAvailable()) {
      cudaError_t err = cudaHostRegister(p, rounded, cudaHostRegisterDefault);
      locked = err == cudaSuccess;
      if (!locked) {
        cudaGetLastError();
        static std::once_flag warned;
        std::call_once(warned, [&] {
          spdlog::warn(
              "could not page-lock {} bytes of host optimizer state ({}); it stays pageable, and the "
              "GPU does not help update it",
              rounded, cudaGetErrorString(err));
        });
      }
    }
#endif
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[p] = Block{rounded, locked};
    countAllocation(stats_, rounded);
    return p;
  }
  void deallocate(void* ptr) override {
    if (!ptr) return;
    Block block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(ptr);
      STRATA_CHECK(it != blocks_.end(), "host state allocator: freeing a pointer it did not allocate");
      block = it->second;
      countFree(stats_, block.bytes);
      blocks_.erase(it);
    }
#if STRATA_CUDA
    if (block.locked) cudaHostUnregister(ptr);
#endif
    munmap(ptr, block.bytes);
  }
  Device device() const override {
    return Device::cpu();
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  std::string name() const override {
    return pinned_ ? "host state (pinned)" : "host state";
  }

 private:
  struct Block {
    size_t bytes = 0;
    bool locked = false;
  };
  bool pinned_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
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

Allocator& hostStateAllocator(bool pinned) {
  static HostStateAllocator* plain = new HostStateAllocator(false);  // never destroyed, as cpuAllocator
  static HostStateAllocator* locked = new HostStateAllocator(true);
  return pinned ? *locked : *plain;
}

Allocator& deviceAllocator(Device device) {
  if (device.isCpu()) return cpuAllocator();
#if STRATA_CUDA
  return *cuda::deviceContext(device.index).allocator;
#else
  STRATA_FAIL("device {} requested, but this build of Strata has no CUDA support", toString(device));
#endif
}

// BlockCachingAllocator

namespace {

class EventFence final : public StreamFence {
 public:
  explicit EventFence(const Stream& stream) : event_(stream.device()) { event_.record(stream); }
  bool done() override { return event_.query(); }
  void wait() override { event_.synchronize(); }

 private:
  Event event_;
};

}  // namespace

std::unique_ptr<StreamFence> eventFence(const Stream& stream) {
  return std::make_unique<EventFence>(stream);
}

bool isPageLocked(const void* ptr, size_t bytes) {
#if STRATA_CUDA
  if (!ptr || !cudaAvailable()) return false;
  auto pinned = [](const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error of an unknown pointer
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  };
  return pinned(ptr) && (bytes <= 1 || pinned(static_cast<const char*>(ptr) + bytes - 1));
#else
  (void)ptr;
  (void)bytes;
  return false;
#endif
}

BlockCachingAllocator::BlockCachingAllocator(Device device, RawMemory raw, std::string name,
                                             CachingAllocatorOptions options)
    : device_(device), raw_(std::move(raw)), name_(std::move(name)), options_(std::move(options)) {
  if (!options_.fence) options_.fence = eventFence;
}

BlockCachingAllocator::~BlockCachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    reapPendingLocked(true);
  } catch (const std::exception&) {
    // A failed wait at teardown (a CUDA context already gone): free what we can below.
    for (auto& p : pending_) freeBlocks_.emplace(PoolKey{p.stream, p.size}, p.ptr);
    pending_.clear();
  }
  releaseCachedLocked(0);
}

size_t BlockCachingAllocator::roundSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  bytes = std::max<size_t>(bytes, 1);
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* BlockCachingAllocator::allocate(size_t bytes, const Stream& stream) {
  void* p = tryAllocate(bytes, stream);
  if (!p) {
    AllocatorStats s = stats();
    throw OutOfMemory(
        name_, device_, roundSize(bytes),
        detail::format("{} allocated, {} reserved, {} cached, {} awaiting other streams", s.allocatedBytes,
                       s.reservedBytes, s.reservedBytes - s.allocatedBytes - s.pendingBytes, s.pendingBytes));
  }
  return p;
}

void* BlockCachingAllocator::tryAllocate(size_t bytes, const Stream& stream) {
  size_t size = roundSize(bytes);
  uint64_t streamId = stream.id();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.numAllocations++;
  if (!pending_.empty()) reapPendingLocked(false);
  if (void* p = takeCachedLocked(streamId, size)) return p;
  void* p = growLocked(size);
  if (!p && !pending_.empty()) {
    // Memory is exhausted: the only case in which the host waits for other streams.
    reapPendingLocked(true);
    if (void* cached = takeCachedLocked(streamId, size)) return cached;
    p = growLocked(size);
  }
  if (!p) {
    stats_.numFailedAllocations++;
    return nullptr;
  }
  liveBlocks_[p] = LiveBlock{size, streamId, {}};
  stats_.numRawAllocations++;
  stats_.allocatedBytes += size;
  stats_.reservedBytes += size;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  return p;
}

void* BlockCachingAllocator::takeCachedLocked(uint64_t stream, size_t size) {
  // Best fit among the stream's cached blocks, but never hand out a block more than twice the request: that
  // would strand memory.
  auto it = freeBlocks_.lower_bound(PoolKey{stream, size});
  if (it == freeBlocks_.end() || it->first.first != stream || it->first.second > 2 * size) return nullptr;
  void* p = it->second;
  size_t blockSize = it->first.second;
  freeBlocks_.erase(it);
  liveBlocks_[p] = LiveBlock{blockSize, stream, {}};
  stats_.allocatedBytes += blockSize;
  stats_.numCacheHits++;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  return p;
}

void* BlockCachingAllocator::growLocked(size_t size) {
  size_t limit = options_.reserveLimitBytes;
  if (size > limit) return nullptr;
  if (stats_.reservedBytes + size > limit) releaseCachedLocked(limit - size);
  if (stats_.reservedBytes + size > limit) return nullptr;
  void* p = raw_.alloc(size);
  if (!p) {
    // Out of memory: give the cache back and try once more.
    stats_.numRawFailures++;
    if (!freeBlocks_.empty()) stats_.numCacheFlushes++;
    releaseCachedLocked(0);
    p = raw_.alloc(size);
    if (!p) stats_.numRawFailures++;
  }
  return p;
}

void BlockCachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = liveBlocks_.find(ptr);
  STRATA_CHECK(it != liveBlocks_.end(), "{}: freeing a pointer it did not allocate", name_);
  LiveBlock& block = it->second;
  if (block.uses.empty()) {
    freeBlocks_.emplace(PoolKey{block.stream, block.size}, ptr);
  } else {
    PendingBlock pending{ptr, block.size, block.stream, {}};
    for (const Stream& s : block.uses) pending.fences.push_back(options_.fence(s));
    pending_.push_back(std::move(pending));
    stats_.pendingBytes += block.size;
    stats_.numDeferredFrees++;
  }
  stats_.allocatedBytes -= block.size;
  liveBlocks_.erase(it);
}

void BlockCachingAllocator::recordStream(void* ptr, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = liveBlocks_.find(ptr);
  STRATA_CHECK(it != liveBlocks_.end(), "{}: recordStream on a pointer that is not a live block", name_);
  LiveBlock& block = it->second;
  detail::addStreamUse(block.uses, block.stream, stream);
}

void BlockCachingAllocator::reapPendingLocked(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingBlock& p = pending_[i];
    if (detail::retireFences(p.fences, wait)) {
      freeBlocks_.emplace(PoolKey{p.stream, p.size}, p.ptr);
      stats_.pendingBytes -= p.size;
    } else {
      if (kept != i) pending_[kept] = std::move(p);
      ++kept;
    }
  }
  pending_.resize(kept);
}

AllocatorStats BlockCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void BlockCachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  reapPendingLocked(true);
  releaseCachedLocked(0);
}

bool BlockCachingAllocator::hasCachedFit(size_t bytes) const {
  size_t size = roundSize(bytes);
  uint64_t stream = currentStream(device_).id();
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = freeBlocks_.lower_bound(PoolKey{stream, size});
  return it != freeBlocks_.end() && it->first.first == stream && it->first.second <= 2 * size;
}

void BlockCachingAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
  stats_.peakReservedBytes = stats_.reservedBytes;
}

void BlockCachingAllocator::releaseCachedLocked(size_t target) {
  if (stats_.reservedBytes <= target || freeBlocks_.empty()) return;
  if (target == 0) {
    for (auto& [key, ptr] : freeBlocks_) {
      raw_.free(ptr);
      stats_.reservedBytes -= key.second;
    }
    freeBlocks_.clear();
    return;
  }
  std::vector<std::multimap<PoolKey, void*>::iterator> bySize;
  bySize.reserve(freeBlocks_.size());
  for (auto it = freeBlocks_.begin(); it != freeBlocks_.end(); ++it) bySize.push_back(it);
  std::sort(bySize.begin(), bySize.end(),
            [](const auto& a, const auto& b) { return a->first.second > b->first.second; });
  for (auto it : bySize) {
    if (stats_.reservedBytes <= target) break;
    raw_.free(it->second);
    stats_.reservedBytes -= it->first.second;
    freeBlocks_.erase(it);
  }
}

// PinnedHostPool

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
    : capacity_(capacityBytes),
      cache_(Device::cpu(), pinnedOrAligned(pageLocked_), "pinned-host-pool",
             CachingAllocatorOptions{capacityBytes, {}}) {}

PinnedHostPool::PinnedHostPool(size_t capacityBytes, RawMemory raw, FenceFactory fence)
    : capacity_(capacityBytes),
      cache_(Device::cpu(), std::move(raw), "pinned-host-pool",
             CachingAllocatorOptions{capacityBytes, std::move(fence)}) {}

PinnedHostPool::~PinnedHostPool() = default;

void* PinnedHostPool::allocate(size_t bytes) {
  // One pool for every host thread: host work is done when its call returns, so the CPU stream a block was
  // allocated on does not matter. GPU streams are tracked through recordStream.
  void* p = cache_.tryAllocate(bytes, Stream());
  if (!p) {
    AllocatorStats s = cache_.stats();
    throw OutOfMemory(
        "the pinned host pool (zero_optimization.buffer_count and store.host_budget_gb size it)",
        Device::cpu(), bytes,
        detail::format("{} of {} bytes in use, {} awaiting GPU streams", s.allocatedBytes, capacity_,
                       s.pendingBytes));
  }
  return p;
}

void PinnedHostPool::deallocate(void* ptr) {
  cache_.deallocate(ptr);
}

void PinnedHostPool::recordStream(void* ptr, const Stream& stream) {
  cache_.recordStream(ptr, stream);
}

AllocatorStats PinnedHostPool::stats() const {
  return cache_.stats();
}

// SlotArena

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
