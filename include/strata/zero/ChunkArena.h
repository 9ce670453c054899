// The chunk arena: the device memory that ZeRO-3 gathers chunks into.
//
// NOTE [Chunk arena]
// At stage 3 every chunk's parameters are gathered whole into device memory while the modules that use them
// run, and given back soon after (NOTE [Parameter gathering] in zero/ParameterGatherer.h): several times a
// step per chunk. Taken from the caching allocator, those blocks interleave with activations and gradient
// buffers of other sizes, and the reserve grows with what it cannot reuse (NOTE [Fragmentation] in
// core/Allocator.h). The arena takes the memory once instead: one reservation of K slots, each the size of
// the largest padded chunk, handed out by index and never given back until the arena is destroyed, so
// gathering chunks in and out never fragments the device. K is what the engine holds at once: the chunks of
// the running modules, those whose backward is not complete, and the prefetched ones (chunkArenaSlots,
// which `strata plan` counts too). A moment that needs more than K slots either grows the arena by one more
// reservation of one slot (the default: never freed either, so it still cannot fragment, and bounded, since
// a chunk holds one slot at most, by the number of chunks; the growth is logged with its numbers and
// counted) or, with `grow` off, fails naming the numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "strata/core/Allocator.h"
#include "strata/core/Tensor.h"

namespace strata::zero {

struct ChunkArenaStats {
  size_t slots = 0;         // slots reserved (the first reservation's and any grown ones)
  size_t inUse = 0;         // slots handed out now
  size_t peakInUse = 0;     // the most handed out at once
  size_t reservations = 0;  // allocations taken from the backing allocator (1 unless it grew)
  size_t slotBytes = 0;
  size_t reservedBytes() const { return slots * slotBytes; }
};

// K for stage 3 over `numChunks` chunks at zero_optimization.prefetch_depth `prefetchDepth`.
size_t chunkArenaSlots(size_t numChunks, int64_t prefetchDepth);

// The arena's slot classes. A parameter larger than a chunk gets a chunk of its own size (the embedding, in
// GPT): slots that large for every chunk would cost K times its size. So chunks whose used length is within
// the layout's `chunkElems` share one class, with slots of the largest of them, and the oversized ones
// another, with slots of the largest oversized chunk; each class has chunkArenaSlots over its own chunks.
struct ChunkArenaPlan {
  std::vector<int64_t> slotElems;  // per class
  std::vector<size_t> slots;       // per class
  std::vector<int> classOf;        // per chunk
  // Bytes of every class's slots for elements of `elemBytes`.
  uint64_t bytes(size_t elemBytes) const;
};
ChunkArenaPlan planChunkArena(const std::vector<int64_t>& usedElems, const std::vector<int64_t>& paddedElems,
                              int64_t chunkElems, int64_t prefetchDepth);

class ChunkArena {
 public:
  // Reserves `numSlots` slots of `slotBytes` (rounded up to 256) in one allocation from `backing` (the
  // device's allocator).
  ChunkArena(Allocator& backing, size_t slotBytes, size_t numSlots, bool grow = true);
  ~ChunkArena();
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  // The index of a free slot (the one released last first). When every slot is taken: grows by one slot,
  // or throws naming the numbers when growing is off.
  int acquire();
  void release(int slot);
  // A flat tensor of `elems` elements of `dtype` over slot `slot` (not owning it: valid until the slot is
  // released and handed out again).
  Tensor view(int slot, int64_t elems, DType dtype) const;
  void* slotData(int slot) const;
  // Tells the backing allocator that `stream` uses the arena's memory (Allocator::recordStream), so that
  // when the arena is destroyed the memory is reused only after that stream's work; grown reservations too.
  void recordStream(const Stream& stream);
  size_t slotBytes() const { return slotBytes_; }
  Device device() const { return backing_.device(); }
  const ChunkArenaStats& stats() const { return stats_; }

 private:
  Allocator& backing_;
  size_t slotBytes_;
  bool grow_;
  std::vector<std::unique_ptr<SlotArena>> reservations_;
  std::vector<std::pair<size_t, int>> where_;  // by slot: its reservation and its index there
  std::vector<int> free_;                      // free slots; the back is handed out next
  std::vector<bool> inUse_;
  std::vector<Stream> streams_;  // recorded on every reservation
  ChunkArenaStats stats_;
};

}  // namespace strata::zero
