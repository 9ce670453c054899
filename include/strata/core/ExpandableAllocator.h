// The GPU's allocator: blocks split and merged inside one growing address range per stream.
//
// NOTE [Expandable segments]
// A caching allocator whose blocks are each their own cudaMalloc reuses a freed block only for a request of
// about its size; memory freed in the wrong sizes stays reserved, and at the edge of the device that is the
// difference between a step and an out-of-memory (tens of GiB at the 20B and 30B runs: NOTE [Fragmentation]
// in core/Allocator.h). This allocator takes address space instead of memory: each stream's pool (one for
// blocks up to 1 MiB, one for larger ones) reserves a long address range (a segment: the device's memory in
// length), and backs it with physical pages (2 MiB) only where blocks are handed out. Blocks tile the
// segment from its start: a request takes the best-fitting free block, split when the rest is worth keeping,
// or grows the segment at its end; a freed block merges with free neighbours. So memory freed in any sizes is
// one run again as soon as its neighbours are free, and a request that fits nowhere costs only the pages past
// the end, never a new run of its own size. When pages run out (the device, or reserveLimitBytes) the
// allocator waits for the device, unmaps every page that lies wholly inside free blocks, of every pool, and
// tries again: cached memory of any size or stream serves any request, so fragmentation can cost at most the
// partly used pages at the edges of free blocks. Stream-ordered reuse is as in NOTE [Stream-ordered reuse]:
// a block freed while other streams use it stays pending (not merged) until their fences complete.
//
// The bookkeeping is written over PageMemory, so the same code serves CUDA's virtual memory management
// (cuMemAddressReserve, cuMemCreate, cuMemMap; core/cuda/CudaContext.cpp) and is tested on the CPU over
// mmap. STRATA_CUDA_ALLOCATOR=blocks selects the BlockCachingAllocator instead (as do GPUs without virtual
// memory management).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/core/Allocator.h"

namespace strata {

// Address space that is backed by memory page by page.
struct PageMemory {
  size_t pageBytes = 0;  // the mapping granularity: map and unmap take whole pages
  // Reserves `bytes` of address space (no memory behind it), aligned to pageBytes; nullptr when it cannot.
  std::function<void*(size_t bytes)> reserve;
  std::function<void(void* base, size_t bytes)> unreserve;
  // Backs the pages of [at, at + bytes) with new memory the device can read and write; false, with nothing
  // mapped, when the memory is exhausted.
  std::function<bool(void* at, size_t bytes)> map;
  // Gives back the memory behind the pages of [at, at + bytes), each mapped by some earlier map call.
  std::function<void(void* at, size_t bytes)> unmap;
  // Waits for all work queued on the device (before pages that free blocks held are unmapped); may be empty.
  std::function<void()> synchronize;
};

struct ExpandableAllocatorOptions {
  // Mapped bytes never pass this.
  size_t reserveLimitBytes = SIZE_MAX;
  // Address space of one segment; a request longer than it gets a segment of its own length.
  size_t segmentBytes = size_t(1) << 30;
  FenceFactory fence;  // default: eventFence
};

class ExpandableAllocator final : public CachingAllocator {
 public:
  ExpandableAllocator(Device device, PageMemory pages, std::string name,
                      ExpandableAllocatorOptions options = {});
  ~ExpandableAllocator() override;
  ExpandableAllocator(const ExpandableAllocator&) = delete;
  ExpandableAllocator& operator=(const ExpandableAllocator&) = delete;

  using CachingAllocator::allocate;
  void* allocate(size_t bytes, const Stream& stream) override;
  void* tryAllocate(size_t bytes, const Stream& stream) override;
  void deallocate(void* ptr) override;
  void recordStream(void* ptr, const Stream& stream) override;
  Device device() const override { return device_; }
  // reservedBytes are the mapped pages; numRawAllocations counts map calls, numCacheFlushes the times pages
  // of free blocks were unmapped to serve a request.
  AllocatorStats stats() const override;
  std::string name() const override { return name_; }
  // Waits for pending blocks and the device, then unmaps every page no handed-out block touches.
  void emptyCache() override;
  void resetPeakStats() override;
  bool hasCachedFit(size_t bytes) const override;

  // Requests up to this many bytes go to a stream's small-block pool.
  static constexpr size_t kSmallLimit = size_t(1) << 20;
  // Block sizes are multiples of this in the small pool, and of kLargeRound in the large one.
  static constexpr size_t kSmallRound = 512;
  static constexpr size_t kLargeRound = size_t(64) << 10;
  static size_t roundSize(size_t bytes);
  // Segments reserved so far (address ranges, whether or not backed).
  size_t numSegments() const;

 private:
  enum class State : uint8_t { Live, Free, Pending };
  struct Block {
    size_t size = 0;
    State state = State::Free;
  };
  struct FreeKey {
    size_t size;
    size_t segment;  // index into segments_
    size_t offset;
    bool operator<(const FreeKey& o) const {
      if (size != o.size) return size < o.size;
      if (segment != o.segment) return segment < o.segment;
      return offset < o.offset;
    }
  };
  struct Pool {
    uint64_t stream = 0;
    bool small = false;
    std::vector<size_t> segments;  // indices into segments_, in order of reservation
    std::set<FreeKey> free;
  };
  struct Segment {
    char* base = nullptr;
    size_t length = 0;  // address space reserved
    size_t end = 0;     // blocks tile [0, end)
    Pool* pool = nullptr;
    std::map<size_t, Block> blocks;  // by offset
    std::vector<bool> mapped;        // by page
  };
  struct LiveBlock {
    size_t segment = 0;
    size_t offset = 0;
    uint64_t stream = 0;
    std::vector<Stream> uses;  // other streams named by recordStream
  };
  struct PendingBlock {
    size_t segment = 0;
    size_t offset = 0;
    std::vector<std::unique_ptr<StreamFence>> fences;  // outstanding
  };

  // Serves `size` (rounded) from `pool`: a free block or the segment's end; nullptr when pages cannot be had.
  void* serveLocked(Pool& pool, size_t size);
  void* takeFreeLocked(Pool& pool, size_t size);
  void* growLocked(Pool& pool, size_t size);
  // Maps the unmapped pages of [offset, offset + size) of `segment`; false (nothing new mapped) when it
  // cannot.
  bool mapRangeLocked(Segment& segment, size_t offset, size_t size);
  // Hands out the block at `offset` of segment `segment` (already out of the free set) to `stream`.
  void* handOutLocked(size_t segment, size_t offset, uint64_t stream);
  // Marks the block free, merges it with free neighbours and files the result in its pool's free set.
  void freeBlockLocked(size_t segment, size_t offset);
  void reapPendingLocked(bool wait);
  // Unmaps the pages that lie wholly inside free blocks (after waiting for the device); the bytes unmapped.
  size_t unmapFreePagesLocked();
  Pool& poolLocked(uint64_t stream, bool small);

  Device device_;
  PageMemory pages_;
  std::string name_;
  ExpandableAllocatorOptions options_;
  mutable std::mutex mutex_;
  std::map<std::pair<uint64_t, bool>, Pool> pools_;
  std::vector<std::unique_ptr<Segment>> segments_;
  std::unordered_map<void*, LiveBlock> live_;
  std::vector<PendingBlock> pending_;
  AllocatorStats stats_;
};

}  // namespace strata
