// Allocators.
//
// - `cpuAllocator()`: 64-byte aligned host memory.
// - `CachingAllocator`: what a device's allocator offers beyond Allocator: blocks for a given stream, reuse
//   that is stream-ordered (see NOTE [Stream-ordered reuse]), and a cache that can be given back. Two kinds:
//   - `ExpandableAllocator` (core/ExpandableAllocator.h), the GPU's: one growing address range per stream,
//     backed page by page, in which blocks are split and merged (NOTE [Expandable segments]);
//   - `BlockCachingAllocator`: every block its own raw allocation, reused whole. It is written over a pair
//     of raw functions (cudaMalloc, cudaHostAlloc, or test memory); the pinned host pool and GPUs without
//     virtual memory management use it.
// - `PinnedHostPool`: a bounded, thread-safe pool of page-locked host memory for staging transfers. Its
//   reserved bytes (handed out, cached and awaiting other streams) never pass its capacity: cached blocks
//   are released first, then blocks still in use by the GPU are waited for, then the request throws, naming
//   the request and the pool's state.
// - `SlotArena`: one contiguous allocation cut into fixed-size slots. Model-state chunks live in slots, so
//   swapping chunks in and out never fragments device memory.
//
// NOTE [Stream-ordered reuse]
// A block belongs to the stream it was allocated on (the caller's current stream unless one is given).
// Freeing it on the host does not wait for that stream: the block goes back to that stream's pool and is
// handed out only to later allocations on the same stream, whose work runs after everything already
// enqueued there. A block that other streams use as well must be named to the allocator with
// `recordStream(ptr, stream)` (or `StorageImpl::recordStream`) before it is freed. Its free then records a
// fence (an Event) on each of those streams, and the block returns to its pool only once every fence has
// completed; allocations poll the fences and never block the host for them, unless memory is exhausted,
// when the allocator waits for them before giving cached memory back to the raw allocator. A block used only
// on its own stream costs what it did before streams: no event, no poll. Releasing cached blocks to the raw
// allocator (out of memory, emptyCache) relies on the raw free being safe with work still queued on other
// streams: cudaFree and cudaFreeHost synchronise the device.
//
// NOTE [Fragmentation]
// What an allocator's caching costs is its reserve beyond the need: peakReservedBytes, the most taken from
// the device, less peakAllocatedBytes, the most handed out at once (fragmentedAtPeakBytes). It is memory
// cached in the wrong sizes or on another stream when the reserve grew, and it decides how close to the
// device's end a run can go. (What is reserved but unused at a given moment, the difference of the current
// figures, says nothing of it: a step's activations are freed by its end, and their memory stays cached for
// the next step.) Failed raw calls (numRawFailures) and the flushes of the cache that retry them
// (numCacheFlushes) show fragmentation turning into stalls: a flush waits for the device. The GPU's
// ExpandableAllocator merges freed neighbours and, out of pages, gives any stream the pages of every free
// block (NOTE [Expandable segments] in core/ExpandableAllocator.h); stage 3's gathered chunks come from one
// reservation of fixed-size slots (zero/ChunkArena.h).
//
// NOTE [Out of memory]
// An allocation that cannot be served throws OutOfMemory, never a bare check failure: a user-facing Error
// that names the memory (the allocator and its device), the bytes, and what they were for: the calling
// thread's innermost MemoryPurpose ("activations", "a stage-3 gather slot", ...). The allocator's own figures
// travel beside the message (figures(); `strata` prints them under STRATA_DEBUG=1). Code that knows more (the
// trainer: what the device holds by tier, the setting to change) catches it and says so in one line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/core/Device.h"
#include "strata/core/Error.h"
#include "strata/core/Stream.h"

namespace strata {

// What the calling thread allocates for, until the scope ends (NOTE [Out of memory]). Scopes nest; the
// innermost names the allocation. `what` must outlive the scope (a literal).
class MemoryPurpose {
 public:
  explicit MemoryPurpose(const char* what);
  ~MemoryPurpose();
  MemoryPurpose(const MemoryPurpose&) = delete;
  MemoryPurpose& operator=(const MemoryPurpose&) = delete;
  // The innermost purpose of the calling thread, or nullptr.
  static const char* current();

 private:
  const char* previous_;
};

class OutOfMemory : public Error {
 public:
  // `memory`: the allocator's name ("cuda:0", "host", ...); `figures`: its figures at the failure.
  OutOfMemory(const std::string& memory, Device device, size_t bytes, std::string figures);
  // The same failure with what the caller knows added to its message (what holds the memory, what to change).
  OutOfMemory(const OutOfMemory& cause, const std::string& explanation);
  Device device() const { return device_; }
  size_t bytes() const { return bytes_; }
  // What the allocation was for, or "" when no MemoryPurpose was open.
  const std::string& purpose() const { return purpose_; }
  const std::string& figures() const { return figures_; }

 private:
  Device device_;
  size_t bytes_;
  std::string purpose_, figures_;
};

struct AllocatorStats {
  size_t allocatedBytes = 0;  // bytes handed out and not yet returned
  size_t reservedBytes = 0;   // bytes obtained from the raw allocator (allocated + cached)
  size_t peakAllocatedBytes = 0;
  size_t peakReservedBytes = 0;
  size_t numAllocations = 0;     // allocate() calls
  size_t numRawAllocations = 0;  // raw allocator calls
  size_t numCacheHits = 0;
  size_t pendingBytes = 0;      // freed, waiting for other streams' fences before reuse (part of reserved)
  size_t numDeferredFrees = 0;  // frees that had to wait for other streams (see NOTE [Stream-ordered reuse])
  size_t numRawFailures = 0;    // raw allocator calls that failed (cudaMalloc out of memory)
  size_t numCacheFlushes = 0;   // times the cache was given back to the raw allocator to retry a call
  size_t numFailedAllocations = 0;  // requests that could not be served at all (the caller saw out of memory)
  // Share of reserved memory that is not in use (cached, or lost to rounding inside handed-out blocks).
  double fragmentation() const {
    return reservedBytes == 0 ? 0.0 : 1.0 - double(allocatedBytes) / double(reservedBytes);
  }
  // The reserve's peak beyond the most handed out at once (NOTE [Fragmentation]).
  size_t fragmentedAtPeakBytes() const {
    return peakReservedBytes > peakAllocatedBytes ? peakReservedBytes - peakAllocatedBytes : 0;
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
  // Tells the allocator that `stream` uses the block at `ptr` (a pointer allocate() returned), so that once
  // freed the block is reused only after the work enqueued on `stream` before the free has completed (see
  // NOTE [Stream-ordered reuse]). The default does nothing: for memory that no stream reads asynchronously
  // (cpuAllocator's pageable memory: copyAsync refuses it).
  virtual void recordStream(void* ptr, const Stream& stream) {}
  // Restarts the peak figures from the bytes held now (the memory tracer's window).
  virtual void resetPeakStats() {}
};

// True for page-locked host memory that the GPU reads and writes by DMA (cudaHostAlloc, cudaHostRegister, a
// PinnedHostPool with CUDA), over [ptr, ptr + bytes). False without a GPU.
bool isPageLocked(const void* ptr, size_t bytes = 1);

// The process-wide aligned host allocator (stateless apart from its counters).
Allocator& cpuAllocator();
// NOTE [Host state memory]
// Optimizer state kept in host memory (tens of GiB, streamed through once per step) comes from its own
// allocator: each block is its own anonymous mapping, page-aligned (no two blocks share a page, so each can
// be registered with the driver on its own). Transparent huge pages were measured and left out: on the H200
// host the CPU AdamW kernel ran 18% slower over huge-page buffers (bench_cpu_adamw --memory huge,
// BENCHMARKS.md). With `pinned` and a GPU present each block is also page-locked in place (cudaHostRegister),
// so that the GPU can copy it by DMA without staging: the pipelined optimizer's GPU lane streams host state
// through the GPU (NOTE [Pipelined update] in optim/AdamW.h). Pinning a block that the driver refuses (e.g. a
// locked-memory limit) logs a warning once and leaves it pageable; isPageLocked tells which it is.
Allocator& hostStateAllocator(bool pinned);
// The allocator tensors on `device` use: cpuAllocator() for the CPU, that GPU's caching allocator for CUDA.
Allocator& deviceAllocator(Device device);

struct RawMemory {
  std::function<void*(size_t)> alloc;  // returns nullptr when out of memory
  std::function<void(void*)> free;
};

// A point on a stream: done() polls whether the work enqueued before it has completed, wait() blocks the
// host until it has.
class StreamFence {
 public:
  virtual ~StreamFence() = default;
  virtual bool done() = 0;
  virtual void wait() = 0;
};
// Makes a fence at the current end of `stream`. The default (an empty function) records an Event; tests
// pass fences they complete by hand.
using FenceFactory = std::function<std::unique_ptr<StreamFence>(const Stream& stream)>;
// The default fence: an Event recorded on `stream`.
std::unique_ptr<StreamFence> eventFence(const Stream& stream);

struct CachingAllocatorOptions {
  // Reserved bytes (handed out, cached and pending) never pass this: a request that would is served by
  // releasing cached blocks first, then by waiting for pending ones, and fails otherwise.
  size_t reserveLimitBytes = SIZE_MAX;
  FenceFactory fence;
};

// A device allocator with stream-ordered reuse and a cache (NOTE [Stream-ordered reuse]).
class CachingAllocator : public Allocator {
 public:
  // A block for work on the current stream of device().
  void* allocate(size_t bytes) override { return allocate(bytes, currentStream(device())); }
  // A block for work on `stream`: cached memory freed on `stream`, else new memory. Throws OutOfMemory.
  virtual void* allocate(size_t bytes, const Stream& stream) = 0;
  // As allocate(), but nullptr where allocate() throws (neither the cache nor the raw memory can serve it).
  virtual void* tryAllocate(size_t bytes, const Stream& stream) = 0;
  // Waits for the fences of pending blocks (blocking the host), then gives every cached byte back to the
  // raw memory. Blocks still handed out are untouched.
  virtual void emptyCache() = 0;
  // True when allocate(bytes) on the current stream would be served from the cache.
  virtual bool hasCachedFit(size_t bytes) const = 0;
};

class BlockCachingAllocator final : public CachingAllocator {
 public:
  BlockCachingAllocator(Device device, RawMemory raw, std::string name, CachingAllocatorOptions options = {});
  ~BlockCachingAllocator() override;

  using CachingAllocator::allocate;
  void* allocate(size_t bytes, const Stream& stream) override;
  void* tryAllocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr) override;
  void recordStream(void* ptr, const Stream& stream) override;
  Device device() const override { return device_; }
  AllocatorStats stats() const override;
  std::string name() const override { return name_; }

  void emptyCache() override;
  void resetPeakStats() override;
  bool hasCachedFit(size_t bytes) const override;
  // Sizes are rounded up so that blocks are reusable across slightly different requests.
  static size_t roundSize(size_t bytes);

 private:
  struct LiveBlock {
    size_t size = 0;
    uint64_t stream = 0;       // id of the stream it was allocated on
    std::vector<Stream> uses;  // other streams named by recordStream
  };
  struct PendingBlock {
    void* ptr = nullptr;
    size_t size = 0;
    uint64_t stream = 0;
    std::vector<std::unique_ptr<StreamFence>> fences;  // outstanding
  };
  using PoolKey = std::pair<uint64_t, size_t>;  // (stream id, size)

  void* takeCachedLocked(uint64_t stream, size_t size);
  void* growLocked(size_t size);
  // Moves pending blocks whose fences have all completed into the cache; with `wait`, waits for all.
  void reapPendingLocked(bool wait);
  // Frees cached blocks, largest first, until reservedBytes <= target.
  void releaseCachedLocked(size_t target);

  Device device_;
  RawMemory raw_;
  std::string name_;
  CachingAllocatorOptions options_;
  mutable std::mutex mutex_;
  std::multimap<PoolKey, void*> freeBlocks_;
  std::unordered_map<void*, LiveBlock> liveBlocks_;
  std::vector<PendingBlock> pending_;
  AllocatorStats stats_;
};

// Thread-safe. Host threads share one pool whatever their current CPU stream; GPU streams that read or
// write a block (an async copy) must be named with recordStream before the block is freed.
class PinnedHostPool final : public Allocator {
 public:
  // Uses page-locked memory (cudaHostAlloc) when CUDA is available, aligned host memory otherwise.
  explicit PinnedHostPool(size_t capacityBytes);
  PinnedHostPool(size_t capacityBytes, RawMemory raw, FenceFactory fence = {});
  ~PinnedHostPool() override;

  // Throws "pinned host pool exhausted" when the block cannot fit in the capacity even after releasing the
  // cached blocks and waiting for those that GPU streams still use.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) override;
  void recordStream(void* ptr, const Stream& stream) override;
  Device device() const override { return Device::cpu(); }
  AllocatorStats stats() const override;
  std::string name() const override { return "pinned-host-pool"; }

  size_t capacityBytes() const { return capacity_; }
  bool isPageLocked() const { return pageLocked_; }

 private:
  size_t capacity_;
  bool pageLocked_ = false;
  BlockCachingAllocator cache_;
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
