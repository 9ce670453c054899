#include "strata/core/ExpandableAllocator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "core/StreamUses.h"
#include "strata/core/Error.h"

namespace strata {

namespace {
size_t roundUp(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}
}  // namespace

ExpandableAllocator::ExpandableAllocator(Device device, PageMemory pages, std::string name,
                                         ExpandableAllocatorOptions options)
    : device_(device), pages_(std::move(pages)), name_(std::move(name)), options_(std::move(options)) {
  STRATA_CHECK(pages_.pageBytes > 0 && pages_.reserve && pages_.unreserve && pages_.map && pages_.unmap,
               "{}: the page memory needs a page size and its four functions", name_);
  STRATA_CHECK(pages_.pageBytes % kLargeRound == 0, "{}: page size {} is not a multiple of {}", name_,
               pages_.pageBytes, kLargeRound);
  options_.segmentBytes = roundUp(std::max(options_.segmentBytes, pages_.pageBytes), pages_.pageBytes);
  if (!options_.fence) options_.fence = eventFence;
}

ExpandableAllocator::~ExpandableAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    reapPendingLocked(true);
    if (pages_.synchronize) pages_.synchronize();
  } catch (const std::exception&) {
    // A failed wait at teardown (a CUDA context already gone): give back what we can below.
  }
  for (auto& segment : segments_) {
    const size_t page = pages_.pageBytes;
    for (size_t p = 0; p < segment->mapped.size();) {
      if (!segment->mapped[p]) {
        ++p;
        continue;
      }
      size_t q = p;
      while (q < segment->mapped.size() && segment->mapped[q]) ++q;
      pages_.unmap(segment->base + p * page, (q - p) * page);
      p = q;
    }
    pages_.unreserve(segment->base, segment->length);
  }
}

size_t ExpandableAllocator::roundSize(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  return bytes <= kSmallLimit ? roundUp(bytes, kSmallRound) : roundUp(bytes, kLargeRound);
}

size_t ExpandableAllocator::numSegments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return segments_.size();
}

ExpandableAllocator::Pool& ExpandableAllocator::poolLocked(uint64_t stream, bool small) {
  Pool& pool = pools_[{stream, small}];
  pool.stream = stream;
  pool.small = small;
  return pool;
}

void* ExpandableAllocator::allocate(size_t bytes, const Stream& stream) {
  void* p = tryAllocate(bytes, stream);
  if (!p) {
    AllocatorStats s = stats();
    throw OutOfMemory(name_, device_, roundSize(bytes),
                      detail::format("{} allocated, {} mapped, {} awaiting other streams", s.allocatedBytes,
                                     s.reservedBytes, s.pendingBytes));
  }
  return p;
}

void* ExpandableAllocator::tryAllocate(size_t bytes, const Stream& stream) {
  size_t size = roundSize(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.numAllocations++;
  if (!pending_.empty()) reapPendingLocked(false);
  Pool& pool = poolLocked(stream.id(), size <= kSmallLimit);
  if (void* p = serveLocked(pool, size)) return p;
  // Out of pages: wait for the blocks other streams still use, give back every page that only free blocks
  // cover (of every pool), and try once more.
  reapPendingLocked(true);
  if (unmapFreePagesLocked() > 0) stats_.numCacheFlushes++;
  if (void* p = serveLocked(pool, size)) return p;
  stats_.numFailedAllocations++;
  return nullptr;
}

void* ExpandableAllocator::serveLocked(Pool& pool, size_t size) {
  if (void* p = takeFreeLocked(pool, size)) return p;
  return growLocked(pool, size);
}

void* ExpandableAllocator::takeFreeLocked(Pool& pool, size_t size) {
  auto it = pool.free.lower_bound(FreeKey{size, 0, 0});
  if (it == pool.free.end()) return nullptr;
  FreeKey key = *it;
  Segment& segment = *segments_[key.segment];
  if (!mapRangeLocked(segment, key.offset, size)) return nullptr;
  pool.free.erase(it);
  Block& block = segment.blocks.at(key.offset);
  // Split when the rest is worth a block of its own: in the large pool, a rest under 1 MiB is handed out
  // with the block rather than left as a sliver no large request fits.
  size_t rest = key.size - size;
  if (rest >= (pool.small ? kSmallRound : kSmallLimit)) {
    block.size = size;
    segment.blocks[key.offset + size] = Block{rest, State::Free};
    pool.free.insert(FreeKey{rest, key.segment, key.offset + size});
  }
  stats_.numCacheHits++;
  return handOutLocked(key.segment, key.offset, pool.stream);
}

void* ExpandableAllocator::growLocked(Pool& pool, size_t size) {
  // The last segment's end, or its free tail block, extended; a new segment when its address space is spent.
  size_t index = SIZE_MAX, offset = 0, tail = 0;
  if (!pool.segments.empty()) {
    index = pool.segments.back();
    Segment& segment = *segments_[index];
    offset = segment.end;
    if (!segment.blocks.empty()) {
      auto last = std::prev(segment.blocks.end());
      if (last->second.state == State::Free) {
        offset = last->first;
        tail = last->second.size;
      }
    }
    if (offset + size > segment.length) index = SIZE_MAX;
  }
  if (index == SIZE_MAX) {
    size_t length = std::max(options_.segmentBytes, roundUp(size, pages_.pageBytes));
    void* base = pages_.reserve(length);
    if (!base) return nullptr;
    auto segment = std::make_unique<Segment>();
    segment->base = static_cast<char*>(base);
    segment->length = length;
    segment->pool = &pool;
    segment->mapped.assign(length / pages_.pageBytes, false);
    index = segments_.size();
    segments_.push_back(std::move(segment));
    pool.segments.push_back(index);
    offset = 0;
    tail = 0;
  }
  Segment& segment = *segments_[index];
  if (!mapRangeLocked(segment, offset, size)) return nullptr;
  if (tail > 0) {
    pool.free.erase(FreeKey{tail, index, offset});
    segment.blocks.at(offset).size = size;
  } else {
    segment.blocks[offset] = Block{size, State::Free};
  }
  segment.end = std::max(segment.end, offset + size);
  return handOutLocked(index, offset, pool.stream);
}

bool ExpandableAllocator::mapRangeLocked(Segment& segment, size_t offset, size_t size) {
  const size_t page = pages_.pageBytes;
  size_t first = offset / page, last = roundUp(offset + size, page) / page;
  std::vector<std::pair<size_t, size_t>> runs;  // unmapped [from, to) page runs
  size_t newBytes = 0;
  for (size_t p = first; p < last;) {
    if (segment.mapped[p]) {
      ++p;
      continue;
    }
    size_t q = p;
    while (q < last && !segment.mapped[q]) ++q;
    runs.emplace_back(p, q);
    newBytes += (q - p) * page;
    p = q;
  }
  if (runs.empty()) return true;
  if (stats_.reservedBytes + newBytes > options_.reserveLimitBytes) return false;
  for (size_t r = 0; r < runs.size(); ++r) {
    auto [p, q] = runs[r];
    if (!pages_.map(segment.base + p * page, (q - p) * page)) {
      stats_.numRawFailures++;
      for (size_t u = 0; u < r; ++u)
        pages_.unmap(segment.base + runs[u].first * page, (runs[u].second - runs[u].first) * page);
      return false;
    }
    stats_.numRawAllocations++;
  }
  for (auto [p, q] : runs)
    for (size_t i = p; i < q; ++i) segment.mapped[i] = true;
  stats_.reservedBytes += newBytes;
  return true;
}

void* ExpandableAllocator::handOutLocked(size_t index, size_t offset, uint64_t stream) {
  Segment& segment = *segments_[index];
  Block& block = segment.blocks.at(offset);
  block.state = State::Live;
  void* p = segment.base + offset;
  live_[p] = LiveBlock{index, offset, stream, {}};
  stats_.allocatedBytes += block.size;
  stats_.peakAllocatedBytes = std::max(stats_.peakAllocatedBytes, stats_.allocatedBytes);
  stats_.peakReservedBytes = std::max(stats_.peakReservedBytes, stats_.reservedBytes);
  return p;
}

void ExpandableAllocator::freeBlockLocked(size_t index, size_t offset) {
  Segment& segment = *segments_[index];
  Pool& pool = *segment.pool;
  auto it = segment.blocks.find(offset);
  it->second.state = State::Free;
  auto next = std::next(it);
  if (next != segment.blocks.end() && next->second.state == State::Free) {
    pool.free.erase(FreeKey{next->second.size, index, next->first});
    it->second.size += next->second.size;
    segment.blocks.erase(next);
  }
  if (it != segment.blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.state == State::Free) {
      pool.free.erase(FreeKey{prev->second.size, index, prev->first});
      prev->second.size += it->second.size;
      segment.blocks.erase(it);
      it = prev;
    }
  }
  pool.free.insert(FreeKey{it->second.size, index, it->first});
}

void ExpandableAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  STRATA_CHECK(it != live_.end(), "{}: freeing a pointer it did not allocate", name_);
  LiveBlock& live = it->second;
  Block& block = segments_[live.segment]->blocks.at(live.offset);
  stats_.allocatedBytes -= block.size;
  if (live.uses.empty()) {
    freeBlockLocked(live.segment, live.offset);
  } else {
    block.state = State::Pending;
    PendingBlock pending{live.segment, live.offset, {}};
    for (const Stream& s : live.uses) pending.fences.push_back(options_.fence(s));
    pending_.push_back(std::move(pending));
    stats_.pendingBytes += block.size;
    stats_.numDeferredFrees++;
  }
  live_.erase(it);
}

void ExpandableAllocator::recordStream(void* ptr, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  STRATA_CHECK(it != live_.end(), "{}: recordStream on a pointer that is not a live block", name_);
  LiveBlock& live = it->second;
  detail::addStreamUse(live.uses, live.stream, stream);
}

void ExpandableAllocator::reapPendingLocked(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    PendingBlock& p = pending_[i];
    if (detail::retireFences(p.fences, wait)) {
      stats_.pendingBytes -= segments_[p.segment]->blocks.at(p.offset).size;
      freeBlockLocked(p.segment, p.offset);
    } else {
      if (kept != i) pending_[kept] = std::move(p);
      ++kept;
    }
  }
  pending_.resize(kept);
}

size_t ExpandableAllocator::unmapFreePagesLocked() {
  const size_t page = pages_.pageBytes;
  bool synchronized = false;
  size_t unmapped = 0;
  for (auto& [key, pool] : pools_) {
    for (const FreeKey& block : pool.free) {
      Segment& segment = *segments_[block.segment];
      // Only the pages wholly inside the block: its edges may share a page with a live neighbour (past the
      // segment's end there is none).
      size_t end = block.offset + block.size;
      size_t first = roundUp(block.offset, page) / page;
      size_t last = end == segment.end ? roundUp(end, page) / page : end / page;
      for (size_t p = first; p < last;) {
        if (!segment.mapped[p]) {
          ++p;
          continue;
        }
        size_t q = p;
        while (q < last && segment.mapped[q]) ++q;
        // A free block may still be read or written by work its stream queued before the free.
        if (!synchronized && pages_.synchronize) pages_.synchronize();
        synchronized = true;
        pages_.unmap(segment.base + p * page, (q - p) * page);
        for (size_t i = p; i < q; ++i) segment.mapped[i] = false;
        unmapped += (q - p) * page;
        p = q;
      }
    }
  }
  stats_.reservedBytes -= unmapped;
  return unmapped;
}

AllocatorStats ExpandableAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void ExpandableAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  reapPendingLocked(true);
  unmapFreePagesLocked();
}

void ExpandableAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peakAllocatedBytes = stats_.allocatedBytes;
  stats_.peakReservedBytes = stats_.reservedBytes;
}

bool ExpandableAllocator::hasCachedFit(size_t bytes) const {
  size_t size = roundSize(bytes);
  uint64_t stream = currentStream(device_).id();
  std::lock_guard<std::mutex> lock(mutex_);
  auto pool = pools_.find({stream, size <= kSmallLimit});
  if (pool == pools_.end()) return false;
  auto it = pool->second.free.lower_bound(FreeKey{size, 0, 0});
  if (it == pool->second.free.end()) return false;
  const Segment& segment = *segments_[it->segment];
  const size_t page = pages_.pageBytes;
  for (size_t p = it->offset / page; p < roundUp(it->offset + size, page) / page; ++p)
    if (!segment.mapped[p]) return false;
  return true;
}

}  // namespace strata
