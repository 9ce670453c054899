// Allocators.
//
// - `cpuAllocator()`: 64-byte aligned host memory.
// - `CachingAllocator`: keeps freed blocks for reuse so steady-state training makes no raw allocations. It is
// written
//   over a pair of raw functions, so the same bookkeeping serves CUDA (cudaMalloc) and is tested on the CPU.
// - `PinnedHostPool`: a bounded pool of page-locked host memory for staging transfers. It never grows past
// its
//   capacity: an allocation that does not fit throws, naming the request and the pool's state.
// - `SlotArena`: one contiguous allocation cut into fixed-size slots. Model-state chunks live in slots, so
// swapping
//   chunks in and out never fragments device memory.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/core/Device.h"

namespace strata {

struct AllocatorStats {
  size_t allocatedBytes = 0;  // bytes handed out and not yet returned
  size_t reservedBytes = 0;   // bytes obtained from the raw allocator (allocated + cached)
  size_t peakAllocatedBytes = 0;
  size_t peakReservedBytes = 0;
  size_t numAllocations = 0;     // allocate() calls
  size_t numRawAllocations = 0;  // raw allocator calls
  size_t numCacheHits = 0;
  // Share of reserved memory that is not in use (cached, or lost to rounding inside handed-out blocks).
  double fragmentation() const {
    return reservedBytes == 0 ? 0.0 : 1.0 - double(allocatedBytes) / double(reservedBytes);
  }
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual Device device() const = 0;
  virtual AllocatorStats stats() const = 0;
  virtual std::string name() const = 0;
};

// The process-wide aligned host allocator (stateless apart from its counters).
Allocator& cpuAllocator();
// The allocator tensors on `device` use: cpuAllocator() for the CPU, that GPU's caching allocator for CUDA.
Allocator& deviceAllocator(Device device);

struct RawMemory {
  std::function<void*(size_t)> alloc;  // returns nullptr when out of memory
  std::function<void(void*)> free;
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(Device device, RawMemory raw, std::string name);
  ~CachingAllocator() override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  std::string name() const override { return name_; }

  // Returns every cached (free) block to the raw allocator.
  void emptyCache();
  void resetPeakStats();
  // True when allocate(bytes) would be served from the cache.
  bool hasCachedFit(size_t bytes) const;
  // Sizes are rounded up so that blocks are reusable across slightly different requests.
  static size_t roundSize(size_t bytes);

 private:
  void releaseCachedLocked();

  Device device_;
  RawMemory raw_;
  std::string name_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> freeBlocks_;       // size -> block
  std::unordered_map<void*, size_t> liveBlocks_;  // block -> rounded size
  AllocatorStats stats_;
};

class PinnedHostPool final : public Allocator {
 public:
  // Uses page-locked memory (cudaHostAlloc) when CUDA is available, aligned host memory otherwise.
  explicit PinnedHostPool(size_t capacityBytes);
  PinnedHostPool(size_t capacityBytes, RawMemory raw);
  ~PinnedHostPool() override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override;
  std::string name() const override { return "pinned-host-pool"; }

  size_t capacityBytes() const { return capacity_; }
  bool isPageLocked() const { return pageLocked_; }

 private:
  size_t capacity_;
  bool pageLocked_ = false;
  CachingAllocator cache_;
};

class SlotArena {
 public:
  SlotArena(Allocator& backing, size_t slotBytes, size_t numSlots);
  ~SlotArena();
  SlotArena(const SlotArena&) = delete;
  SlotArena& operator=(const SlotArena&) = delete;

  // Index of a free slot, or -1 when all are taken.
  int acquire();
  void release(int slot);
  void* slotData(int slot) const;
  size_t slotBytes() const { return slotBytes_; }
  size_t numSlots() const { return numSlots_; }
  size_t freeSlots() const { return free_.size(); }
  Device device() const { return backing_.device(); }

 private:
  Allocator& backing_;
  size_t slotBytes_;
  size_t numSlots_;
  char* base_ = nullptr;
  std::vector<int> free_;
  std::vector<bool> inUse_;
};

}  // namespace strata
