// NOTE [Expandable segments] (core/ExpandableAllocator.h), over host address space that is really mapped and
// unmapped page by page: a block handed out over an unmapped page faults when written.
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "TestUtil.h"
#include "core/ManualFences.h"
#include "strata/core/ExpandableAllocator.h"

#if STRATA_CUDA
#include <cuda_runtime.h>

#include <chrono>
#endif

using namespace strata;
using strata::test::ManualFences;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

// PageMemory over mmap: reserve is PROT_NONE address space, map makes pages readable and writable (up to a
// limit, standing in for the device's memory), unmap gives them back. Checks that the allocator never maps a
// page twice nor unmaps one it did not map.
struct HostPages {
  size_t page;
  size_t limit;
  size_t mapped = 0;
  int syncs = 0, maps = 0;
  std::set<char*> pages;
  std::map<char*, size_t> reserved;

  HostPages(size_t pageBytes, size_t limitBytes) : page(pageBytes), limit(limitBytes) {}
  ~HostPages() {
    for (auto [base, bytes] : reserved) munmap(base, bytes);
  }

  PageMemory memory() {
    PageMemory m;
    m.pageBytes = page;
    m.reserve = [this](size_t bytes) -> void* {
      void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      reserved[static_cast<char*>(p)] = bytes;
      return p;
    };
    m.unreserve = [this](void* base, size_t bytes) {
      REQUIRE(reserved.at(static_cast<char*>(base)) == bytes);
      munmap(base, bytes);
      reserved.erase(static_cast<char*>(base));
    };
    m.map = [this](void* at, size_t bytes) {
      REQUIRE(bytes % page == 0);
      if (mapped + bytes > limit) return false;
      for (size_t off = 0; off < bytes; off += page)
        REQUIRE(pages.insert(static_cast<char*>(at) + off).second);
      REQUIRE(mprotect(at, bytes, PROT_READ | PROT_WRITE) == 0);
      mapped += bytes;
      maps++;
      return true;
    };
    m.unmap = [this](void* at, size_t bytes) {
      for (size_t off = 0; off < bytes; off += page) REQUIRE(pages.erase(static_cast<char*>(at) + off) == 1);
      REQUIRE(madvise(at, bytes, MADV_DONTNEED) == 0);
      REQUIRE(mprotect(at, bytes, PROT_NONE) == 0);
      mapped -= bytes;
    };
    m.synchronize = [this] { syncs++; };
    return m;
  }
};

ExpandableAllocatorOptions options(size_t segmentBytes, FenceFactory fence = {}) {
  ExpandableAllocatorOptions o;
  o.segmentBytes = segmentBytes;
  o.fence = std::move(fence);
  return o;
}

char* at(void* p) {
  return static_cast<char*>(p);
}

}  // namespace

TEST_CASE("expandable allocator cuts blocks from one range and merges them when freed", "[core][allocator]") {
  HostPages host(64 << 10, 64 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(16 * kMiB));
  Stream s;
  // Small blocks follow each other in the stream's small pool.
  void* a = alloc.allocate(1000, s);
  void* b = alloc.allocate(1000, s);
  void* c = alloc.allocate(1000, s);
  REQUIRE(at(b) == at(a) + 1024);
  REQUIRE(at(c) == at(b) + 1024);
  std::memset(a, 1, 1000);
  std::memset(c, 3, 1000);
  // A freed block is reused in place; freed neighbours become one block that serves a larger request.
  alloc.deallocate(b);
  REQUIRE(alloc.allocate(900, s) == b);
  alloc.deallocate(a);
  alloc.deallocate(b);
  void* ab = alloc.allocate(2048, s);
  REQUIRE(ab == a);
  REQUIRE(at(c)[999] == 3);
  alloc.deallocate(ab);
  alloc.deallocate(c);
  REQUIRE(alloc.stats().allocatedBytes == 0);
  REQUIRE(alloc.numSegments() == 1);
}

TEST_CASE("expandable allocator serves a large request from memory freed in small pieces, with no new pages",
          "[core][allocator]") {
  HostPages host(kMiB, 256 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(128 * kMiB));
  Stream s;
  std::vector<void*> pieces;
  for (int i = 0; i < 8; ++i) pieces.push_back(alloc.allocate(3 * kMiB, s));
  for (void* p : pieces) std::memset(p, 7, 3 * kMiB);
  for (void* p : pieces) alloc.deallocate(p);
  size_t before = alloc.stats().reservedBytes;
  REQUIRE(before == 24 * kMiB);
  // 24 MiB freed as eight blocks is one 24 MiB run: what a whole-block cache cannot reuse for this request.
  void* whole = alloc.allocate(24 * kMiB, s);
  REQUIRE(whole == pieces[0]);
  AllocatorStats stats = alloc.stats();
  REQUIRE(stats.reservedBytes == before);
  REQUIRE(stats.fragmentedAtPeakBytes() == 0);
  std::memset(whole, 9, 24 * kMiB);
  // A request past the run grows it at the end, by the missing pages only.
  alloc.deallocate(whole);
  void* longer = alloc.allocate(26 * kMiB, s);
  REQUIRE(longer == pieces[0]);
  REQUIRE(alloc.stats().reservedBytes == 26 * kMiB);
  alloc.deallocate(longer);
}

TEST_CASE("expandable allocator splits a large block only when the rest is worth keeping",
          "[core][allocator]") {
  HostPages host(kMiB, 64 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(32 * kMiB));
  Stream s;
  void* big = alloc.allocate(8 * kMiB, s);
  void* guard = alloc.allocate(2 * kMiB, s);  // keeps the freed block from merging with the segment's end
  alloc.deallocate(big);
  // 8 MiB free: a 7.5 MiB request leaves 0.5 MiB, too little for a large block: handed out whole.
  void* p = alloc.allocate(7 * kMiB + kMiB / 2, s);
  REQUIRE(p == big);
  REQUIRE(alloc.stats().allocatedBytes == 10 * kMiB);
  alloc.deallocate(p);
  // A 5 MiB request leaves 3 MiB, which the next request takes.
  void* q = alloc.allocate(5 * kMiB, s);
  void* r = alloc.allocate(3 * kMiB, s);
  REQUIRE(q == big);
  REQUIRE(at(r) == at(big) + 5 * kMiB);
  REQUIRE(alloc.stats().allocatedBytes == 10 * kMiB);
  for (void* x : {q, r, guard}) alloc.deallocate(x);
}

TEST_CASE("expandable allocator out of pages gives the pages of free blocks to any stream",
          "[core][allocator][stream]") {
  HostPages host(kMiB, 8 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(16 * kMiB));
  Stream mine = Stream::create(Device::cpu()), other = Stream::create(Device::cpu());
  void* a = alloc.allocate(6 * kMiB, mine);
  alloc.deallocate(a);  // cached on `mine`
  REQUIRE(alloc.stats().reservedBytes == 6 * kMiB);
  // `other` needs 4 MiB: 6 + 4 pass the 8 MiB there are, so after waiting for the device the free block's
  // pages are unmapped and mapped again for `other`.
  void* b = alloc.allocate(4 * kMiB, other);
  std::memset(b, 5, 4 * kMiB);
  AllocatorStats s = alloc.stats();
  REQUIRE(s.reservedBytes == 4 * kMiB);
  REQUIRE(s.numCacheFlushes == 1);
  REQUIRE(host.syncs == 1);
  // `mine` gets its block back by mapping its pages again where room allows.
  void* c = alloc.allocate(4 * kMiB, mine);
  REQUIRE(c == a);
  std::memset(c, 6, 4 * kMiB);
  REQUIRE(alloc.stats().reservedBytes == 8 * kMiB);
  // Now nothing is free anywhere: a further request fails, named.
  REQUIRE(alloc.tryAllocate(kMiB + 1, other) == nullptr);
  REQUIRE_THROWS_AS(alloc.allocate(2 * kMiB, mine), OutOfMemory);
  REQUIRE(alloc.stats().numFailedAllocations == 2);
  alloc.deallocate(b);
  alloc.deallocate(c);
  alloc.emptyCache();
  REQUIRE(alloc.stats().reservedBytes == 0);
  REQUIRE(host.mapped == 0);
}

TEST_CASE("expandable allocator keeps a block other streams use out of reuse and merging until their fences",
          "[core][allocator][stream]") {
  HostPages host(64 << 10, 64 * kMiB);
  ManualFences fences;
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(16 * kMiB, fences.factory()));
  Stream mine = Stream::create(Device::cpu()), reader = Stream::create(Device::cpu());
  void* a = alloc.allocate(4096, mine);
  void* b = alloc.allocate(4096, mine);
  alloc.recordStream(a, reader);
  alloc.deallocate(a);
  alloc.deallocate(b);
  REQUIRE(alloc.stats().pendingBytes == 4096);
  REQUIRE(alloc.stats().numDeferredFrees == 1);
  // `a` is pending: an 8 KiB request cannot have a + b, and a 4 KiB one gets b.
  void* c = alloc.allocate(8192, mine);
  REQUIRE(c != a);
  void* d = alloc.allocate(4096, mine);
  REQUIRE(d != a);
  fences.completeAll();
  alloc.deallocate(d);
  void* e = alloc.allocate(4096, mine);  // polls the fence: a is free again
  REQUIRE(e == a);
  REQUIRE(alloc.stats().pendingBytes == 0);
  REQUIRE(fences.waits == 0);
  for (void* p : {c, e}) alloc.deallocate(p);
}

TEST_CASE("expandable allocator's empty cache unmaps only pages no live block touches", "[core][allocator]") {
  HostPages host(kMiB, 64 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(32 * kMiB));
  Stream s;
  void* head = alloc.allocate(kMiB + kMiB / 2, s);  // pages 0 and 1
  void* body = alloc.allocate(5 * kMiB, s);         // pages 1 to 6
  void* tail = alloc.allocate(2 * kMiB, s);         // pages 6 to 8
  std::memset(head, 1, kMiB + kMiB / 2);
  std::memset(tail, 3, 2 * kMiB);
  REQUIRE(alloc.stats().reservedBytes == 9 * kMiB);
  alloc.deallocate(body);
  alloc.emptyCache();
  // Pages 2 to 5 lie wholly in the freed block; 1 and 6 are shared with live neighbours and stay.
  REQUIRE(alloc.stats().reservedBytes == 5 * kMiB);
  REQUIRE(at(head)[kMiB + kMiB / 2 - 1] == 1);
  REQUIRE(at(tail)[0] == 3);
  REQUIRE(host.syncs == 1);
  // The freed block is handed out again over pages mapped anew.
  void* again = alloc.allocate(5 * kMiB, s);
  REQUIRE(again == body);
  std::memset(again, 2, 5 * kMiB);
  REQUIRE(alloc.stats().reservedBytes == 9 * kMiB);
  for (void* p : {head, again, tail}) alloc.deallocate(p);
}

TEST_CASE("expandable allocator gives a request longer than a segment a segment of its own",
          "[core][allocator]") {
  HostPages host(kMiB, 64 * kMiB);
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(4 * kMiB));
  Stream s;
  void* a = alloc.allocate(3 * kMiB, s);
  void* b = alloc.allocate(10 * kMiB, s);  // does not fit behind a: a new segment of 10 MiB
  void* c = alloc.allocate(2 * kMiB, s);   // fits neither: a third
  REQUIRE(alloc.numSegments() == 3);
  std::memset(b, 4, 10 * kMiB);
  std::memset(c, 5, 2 * kMiB);
  REQUIRE(alloc.stats().reservedBytes == 15 * kMiB);
  for (void* p : {a, b, c}) alloc.deallocate(p);
  alloc.emptyCache();
  REQUIRE(host.mapped == 0);
}

TEST_CASE("expandable allocator keeps blocks apart and their bytes intact under random use",
          "[core][allocator]") {
  HostPages host(256 << 10, 512 * kMiB);
  ManualFences fences;
  ExpandableAllocator alloc(Device::cpu(), host.memory(), "expandable", options(64 * kMiB, fences.factory()));
  Stream streams[2] = {Stream::create(Device::cpu()), Stream::create(Device::cpu())};
  struct Live {
    size_t bytes;
    unsigned char fill;
  };
  std::map<char*, Live> live;
  std::mt19937 rng(7);
  auto check = [](char* p, const Live& l) {
    REQUIRE(static_cast<unsigned char>(p[0]) == l.fill);
    REQUIRE(static_cast<unsigned char>(p[l.bytes / 2]) == l.fill);
    REQUIRE(static_cast<unsigned char>(p[l.bytes - 1]) == l.fill);
  };
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && (rng() % 100 < 45 || live.size() > 60)) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      check(it->first, it->second);
      if (rng() % 4 == 0) alloc.recordStream(it->first, streams[rng() % 2]);
      alloc.deallocate(it->first);
      live.erase(it);
      if (rng() % 8 == 0) fences.completeAll();
      continue;
    }
    size_t bytes = rng() % 3 == 0 ? 1 + rng() % 8192 : (size_t(1) << 20) + rng() % (6 * kMiB);
    char* p = at(alloc.allocate(bytes, streams[rng() % 2]));
    // No overlap with any live block.
    auto next = live.lower_bound(p);
    if (next != live.end()) REQUIRE(p + bytes <= next->first);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      REQUIRE(prev->first + prev->second.bytes <= p);
    }
    Live l{bytes, static_cast<unsigned char>(rng())};
    std::memset(p, l.fill, bytes);
    live[p] = l;
  }
  for (auto& [p, l] : live) {
    check(p, l);
    alloc.deallocate(p);
  }
  fences.completeAll();
  alloc.emptyCache();
  AllocatorStats s = alloc.stats();
  REQUIRE(s.allocatedBytes == 0);
  REQUIRE(s.pendingBytes == 0);
  REQUIRE(s.reservedBytes == 0);
  REQUIRE(host.mapped == 0);
}

TEST_CASE("[cuda] the GPU's allocator merges freed blocks and serves a larger request in place",
          "[cuda][allocator]") {
  STRATA_REQUIRE_CUDA();
#if STRATA_CUDA
  Device gpu = Device::cuda(0);
  auto* alloc = dynamic_cast<ExpandableAllocator*>(&deviceAllocator(gpu));
  REQUIRE(alloc != nullptr);       // the default (STRATA_CUDA_ALLOCATOR=expandable) on a GPU with VMM
  Stream s = Stream::create(gpu);  // a fresh stream: its pools start empty
  auto native = static_cast<cudaStream_t>(s.native());
  std::vector<void*> pieces;
  for (int i = 0; i < 8; ++i) {
    pieces.push_back(alloc->allocate(6 * kMiB, s));
    REQUIRE(cudaMemsetAsync(pieces.back(), i, 6 * kMiB, native) == cudaSuccess);
  }
  for (void* p : pieces) alloc->deallocate(p);
  size_t reserved = alloc->stats().reservedBytes;
  void* whole = alloc->allocate(48 * kMiB, s);
  REQUIRE(whole == pieces[0]);
  REQUIRE(alloc->stats().reservedBytes == reserved);
  REQUIRE(cudaMemsetAsync(whole, 1, 48 * kMiB, native) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(native) == cudaSuccess);
  alloc->deallocate(whole);
  // What mapping costs: 4 GiB on a stream of its own, then given back.
  Stream t = Stream::create(gpu);
  auto start = std::chrono::steady_clock::now();
  void* big = alloc->allocate(size_t(4) << 30, t);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(cudaMemsetAsync(big, 0, size_t(4) << 30, static_cast<cudaStream_t>(t.native())) == cudaSuccess);
  alloc->deallocate(big);
  alloc->emptyCache();
  WARN("mapping 4 GiB of 2 MiB pages took " << seconds << " s");
#endif
}
