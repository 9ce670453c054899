#include "strata/zero/ChunkArena.h"

#include <cstdlib>
#include <set>
#include <vector>

#include "TestUtil.h"
#include "strata/core/Error.h"
#include "strata/ops/Ops.h"

using namespace strata;

namespace {

// A caching allocator over counted host memory: the arena's reservations are its raw allocations.
struct CountedHost {
  int allocs = 0, frees = 0;
  BlockCachingAllocator allocator{Device::cpu(),
                                  RawMemory{[this](size_t b) {
                                              allocs++;
                                              return std::malloc(b);
                                            },
                                            [this](void* p) {
                                              frees++;
                                              std::free(p);
                                            }},
                                  "arena-test"};
};

}  // namespace

TEST_CASE("chunk arena slots come from one reservation, are disjoint, and are reused", "[zero][arena]") {
  CountedHost host;
  {
    zero::ChunkArena arena(host.allocator, 1000, 3);
    REQUIRE(arena.slotBytes() == 1024);
    REQUIRE(host.allocs == 1);  // one reservation for every slot
    REQUIRE(host.allocator.stats().allocatedBytes >= 3 * 1024);
    std::vector<int> slots = {arena.acquire(), arena.acquire(), arena.acquire()};
    REQUIRE(std::set<int>(slots.begin(), slots.end()).size() == 3);
    // Disjoint: every pair of slots is at least a slot apart, inside the one reservation.
    std::vector<char*> at;
    for (int s : slots) at.push_back(static_cast<char*>(arena.slotData(s)));
    for (size_t i = 0; i < at.size(); ++i)
      for (size_t j = i + 1; j < at.size(); ++j) REQUIRE(std::abs(at[i] - at[j]) >= 1024);
    // Writing each slot whole leaves the others untouched.
    for (size_t i = 0; i < slots.size(); ++i) ops::fill(arena.view(slots[i], 256, DType::F32), double(i + 1));
    for (size_t i = 0; i < slots.size(); ++i) {
      auto values = arena.view(slots[i], 256, DType::F32).toVector<float>();
      for (float v : values) REQUIRE(v == float(i + 1));
    }
    REQUIRE(arena.stats().inUse == 3);
    REQUIRE(arena.stats().peakInUse == 3);
    // A released slot is the next one handed out: the same memory, no new allocation.
    arena.release(slots[1]);
    REQUIRE(arena.stats().inUse == 2);
    int again = arena.acquire();
    REQUIRE(again == slots[1]);
    REQUIRE(arena.slotData(again) == at[1]);
    REQUIRE(host.allocs == 1);
    REQUIRE(arena.stats().reservations == 1);
    REQUIRE(arena.stats().slots == 3);
    REQUIRE(arena.stats().reservedBytes() == 3 * 1024);
    REQUIRE_THROWS_AS(arena.release(7), Error);
    arena.release(again);
    REQUIRE_THROWS_AS(arena.release(again), Error);
    // A view larger than a slot is refused.
    REQUIRE_THROWS_AS(arena.view(slots[0], 257, DType::F32), Error);
  }
  // Destroyed: the reservation goes back to the allocator (cached there), and nothing else was taken.
  REQUIRE(host.allocator.stats().allocatedBytes == 0);
  host.allocator.emptyCache();
  REQUIRE(host.frees == host.allocs);
}

TEST_CASE("a full chunk arena grows by one reservation of one slot, or fails naming the numbers",
          "[zero][arena]") {
  CountedHost host;
  SECTION("growing") {
    zero::ChunkArena arena(host.allocator, 512, 2);
    int a = arena.acquire(), b = arena.acquire();
    int c = arena.acquire();  // the third: a second reservation
    REQUIRE(host.allocs == 2);
    REQUIRE(arena.stats().reservations == 2);
    REQUIRE(arena.stats().slots == 3);
    REQUIRE(arena.stats().peakInUse == 3);
    REQUIRE(std::set<int>{a, b, c}.size() == 3);
    REQUIRE(arena.slotData(c) != arena.slotData(a));
    REQUIRE(arena.slotData(c) != arena.slotData(b));
    // Released and taken again, the grown slot is reused: no third reservation.
    arena.release(c);
    REQUIRE(arena.acquire() == c);
    REQUIRE(host.allocs == 2);
  }
  SECTION("not growing") {
    zero::ChunkArena arena(host.allocator, 512, 2, /*grow=*/false);
    arena.acquire();
    arena.acquire();
    try {
      arena.acquire();
      FAIL("a full arena that may not grow must refuse");
    } catch (const Error& e) {
      std::string what = e.what();
      REQUIRE(what.find("all 2 slots of 512 bytes are in use") != std::string::npos);
      REQUIRE(what.find("store.arena") != std::string::npos);
    }
    REQUIRE(host.allocs == 1);
  }
}

TEST_CASE("oversized chunks get a slot class of their own", "[zero][arena]") {
  // Chunks of up to 100 elements, one oversized (an embedding of 1000) and the rest within the layout's size.
  std::vector<int64_t> used = {1000, 90, 100, 60, 100}, padded = {1000, 92, 100, 60, 100};
  zero::ChunkArenaPlan plan = zero::planChunkArena(used, padded, 100, 2);
  REQUIRE(plan.slotElems == std::vector<int64_t>{100, 1000});
  // Regular: min(4 chunks, depth 2 + 4); oversized: min(1 chunk, 6).
  REQUIRE(plan.slots == std::vector<size_t>{4, 1});
  REQUIRE(plan.classOf == std::vector<int>{1, 0, 0, 0, 0});
  // 4 x 100 + 1 x 1000 elements of 2 bytes, where one class of the largest chunk's slots would take 6 x 1000.
  REQUIRE(plan.bytes(2) == (4 * 100 + 1000) * 2);
  // No oversized chunk: one class.
  zero::ChunkArenaPlan regular = zero::planChunkArena({90, 100}, {90, 100}, 100, 0);
  REQUIRE(regular.slotElems == std::vector<int64_t>{100});
  REQUIRE(regular.slots == std::vector<size_t>{2});
  REQUIRE(regular.classOf == std::vector<int>{0, 0});
}
