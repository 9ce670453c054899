#include "strata/zero/ChunkArena.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "strata/core/Error.h"
#include "strata/core/Storage.h"

namespace strata::zero {

ChunkArenaPlan planChunkArena(const std::vector<int64_t>& usedElems, const std::vector<int64_t>& paddedElems,
                              int64_t chunkElems, int64_t prefetchDepth) {
  STRATA_CHECK(usedElems.size() == paddedElems.size(), "planChunkArena: {} used lengths, {} padded",
               usedElems.size(), paddedElems.size());
  ChunkArenaPlan plan;
  int64_t largest[2] = {0, 0};
  size_t count[2] = {0, 0};
  for (size_t c = 0; c < usedElems.size(); ++c) {
    int k = usedElems[c] > chunkElems ? 1 : 0;
    plan.classOf.push_back(k);
    largest[k] = std::max(largest[k], paddedElems[c]);
    ++count[k];
  }
  // Classes in order, the empty one left out.
  int index[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    if (count[k] == 0) continue;
    index[k] = int(plan.slotElems.size());
    plan.slotElems.push_back(largest[k]);
    plan.slots.push_back(chunkArenaSlots(count[k], prefetchDepth));
  }
  for (int& k : plan.classOf) k = index[k];
  return plan;
}

uint64_t ChunkArenaPlan::bytes(size_t elemBytes) const {
  uint64_t total = 0;
  for (size_t k = 0; k < slots.size(); ++k) total += uint64_t(slots[k]) * uint64_t(slotElems[k]) * elemBytes;
  return total;
}

size_t chunkArenaSlots(size_t numChunks, int64_t prefetchDepth) {
  // What NOTE [Parameter gathering] (zero/ParameterGatherer.h) holds at once: the prefetched chunks, plus the
  // chunks of the running modules and, in backward, those still waiting for their gradients (the tied
  // embedding's from the head to the end of the pass, and the chunks a module straddles). Counted
  // (ZeroStepEngine::peakGatheredChunks) in tests/train/StepEngineTest.cpp: GPT, BERT and T5 with evaluations
  // peak at 4, 5, 5 and 6 chunks at prefetch depths 0, 1, 2 and 4, never above depth + 4.
  constexpr size_t kBeyondPrefetch = 4;
  return std::min(numChunks, size_t(std::max<int64_t>(prefetchDepth, 0)) + kBeyondPrefetch);
}

ChunkArena::ChunkArena(Allocator& backing, size_t slotBytes, size_t numSlots, bool grow)
    : backing_(backing), slotBytes_((slotBytes + 255) / 256 * 256), grow_(grow) {
  STRATA_CHECK(slotBytes > 0 && numSlots > 0, "chunk arena needs a positive slot size and count, got {} x {}",
               numSlots, slotBytes);
  // SlotArena is the reservation; which of its slots are taken is tracked here, across reservations.
  reservations_.push_back(std::make_unique<SlotArena>(backing_, slotBytes_, numSlots));
  for (size_t i = 0; i < numSlots; ++i) where_.emplace_back(0, int(i));
  // acquire() takes from the back: slot 0 first.
  for (size_t i = numSlots; i-- > 0;) free_.push_back(int(i));
  inUse_.assign(numSlots, false);
  stats_.slots = numSlots;
  stats_.reservations = 1;
  stats_.slotBytes = slotBytes_;
}

ChunkArena::~ChunkArena() = default;

int ChunkArena::acquire() {
  if (free_.empty()) {
    STRATA_CHECK(grow_,
                 "chunk arena: all {} slots of {} bytes are in use and one more is needed; it is sized from "
                 "the chunks held at once (zero_optimization.prefetch_depth and the modules running), so "
                 "lower zero_optimization.prefetch_depth, or set store.arena: false",
                 stats_.slots, slotBytes_);
    // One more reservation of one slot (NOTE [Chunk arena]): never freed either, so it cannot fragment.
    reservations_.push_back(std::make_unique<SlotArena>(backing_, slotBytes_, 1));
    for (const Stream& stream : streams_) backing_.recordStream(reservations_.back()->slotData(0), stream);
    where_.emplace_back(reservations_.size() - 1, 0);
    inUse_.push_back(false);
    free_.push_back(int(where_.size() - 1));
    stats_.slots++;
    stats_.reservations++;
    spdlog::warn(
        "chunk arena: {} slots of {:.1f} MiB were all in use; reserved one more ({} slots, {} reservations)",
        stats_.slots - 1, double(slotBytes_) / double(1 << 20), stats_.slots, stats_.reservations);
  }
  int slot = free_.back();
  free_.pop_back();
  inUse_[size_t(slot)] = true;
  stats_.inUse++;
  stats_.peakInUse = std::max(stats_.peakInUse, stats_.inUse);
  return slot;
}

void ChunkArena::release(int slot) {
  STRATA_CHECK(slot >= 0 && size_t(slot) < inUse_.size(), "chunk arena: slot {} out of range ({} slots)",
               slot, inUse_.size());
  STRATA_CHECK(inUse_[size_t(slot)], "chunk arena: slot {} released twice", slot);
  inUse_[size_t(slot)] = false;
  stats_.inUse--;
  free_.push_back(slot);
}

void* ChunkArena::slotData(int slot) const {
  STRATA_CHECK(slot >= 0 && size_t(slot) < where_.size(), "chunk arena: slot {} out of range ({} slots)",
               slot, where_.size());
  auto [r, local] = where_[size_t(slot)];
  return reservations_[r]->slotData(local);
}

void ChunkArena::recordStream(const Stream& stream) {
  streams_.push_back(stream);
  for (const auto& reservation : reservations_) backing_.recordStream(reservation->slotData(0), stream);
}

Tensor ChunkArena::view(int slot, int64_t elems, DType dtype) const {
  size_t bytes = size_t(elems) * dtypeSize(dtype);
  STRATA_CHECK(bytes <= slotBytes_, "chunk arena: {} elements of {} ({} bytes) do not fit a slot of {} bytes",
               elems, dtypeName(dtype), bytes, slotBytes_);
  auto storage = std::make_shared<StorageImpl>(slotData(slot), bytes, device());
  return Tensor::fromStorage(storage, {elems}, {1}, 0, dtype);
}

}  // namespace strata::zero
