#include <cstdlib>
#include <map>

#include "TestUtil.h"

using namespace strata;

namespace {
struct CountingRaw {
  int allocs = 0, frees = 0;
  RawMemory raw() {
    return RawMemory{[this](size_t b) {
                       allocs++;
                       return std::malloc(b);
                     },
                     [this](void* p) {
                       frees++;
                       std::free(p);
                     }};
  }
};
}  // namespace

TEST_CASE("caching allocator reuses freed blocks and tracks stats", "[core][allocator]") {
  CountingRaw counter;
  CachingAllocator alloc(Device::cpu(), counter.raw(), "test");
  void* a = alloc.allocate(1000);
  REQUIRE(alloc.stats().allocatedBytes == 1024);  // rounded to 512
  REQUIRE(alloc.stats().reservedBytes == 1024);
  alloc.deallocate(a);
  REQUIRE(alloc.stats().allocatedBytes == 0);
  REQUIRE(alloc.stats().reservedBytes == 1024);
  REQUIRE(alloc.stats().fragmentation() == 1.0);
  void* b = alloc.allocate(900);  // fits the cached 1024-byte block
  REQUIRE(b == a);
  REQUIRE(counter.allocs == 1);
  REQUIRE(alloc.stats().numCacheHits == 1);
  void* big = alloc.allocate(3u << 20);
  REQUIRE(alloc.stats().allocatedBytes == 1024 + (4u << 20));  // large blocks round to 2 MiB
  REQUIRE(alloc.stats().peakAllocatedBytes == 1024 + (4u << 20));
  alloc.deallocate(big);
  void* small = alloc.allocate(512);  // must not take the 4 MiB block
  REQUIRE(small != big);
  alloc.deallocate(small);
  alloc.deallocate(b);
  alloc.emptyCache();
  REQUIRE(alloc.stats().reservedBytes == 0);
  REQUIRE(counter.frees == counter.allocs);
  REQUIRE_THROWS_AS(alloc.deallocate(reinterpret_cast<void*>(0x1234)), Error);
}

TEST_CASE("caching allocator frees its cache and retries when the raw allocator fails", "[core][allocator]") {
  std::map<void*, size_t> live;
  size_t used = 0;
  const size_t budget = 8192;
  RawMemory raw{[&](size_t b) -> void* {
                  if (used + b > budget) return nullptr;
                  void* p = std::malloc(b);
                  live[p] = b;
                  used += b;
                  return p;
                },
                [&](void* p) {
                  used -= live[p];
                  live.erase(p);
                  std::free(p);
                }};
  CachingAllocator alloc(Device::cpu(), raw, "bounded");
  void* a = alloc.allocate(2048);
  void* b = alloc.allocate(2048);
  alloc.deallocate(a);
  alloc.deallocate(b);
  REQUIRE(alloc.stats().reservedBytes == 4096);
  void* c = alloc.allocate(6144);  // only fits once the two cached blocks are returned
  REQUIRE(c != nullptr);
  REQUIRE(alloc.stats().reservedBytes == 6144);
  try {
    alloc.allocate(4096);
    FAIL("allocation beyond the budget must fail");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("out of memory") != std::string::npos);
  }
  alloc.deallocate(c);
}

TEST_CASE("pinned host pool never grows past its capacity", "[core][allocator]") {
  PinnedHostPool pool(8192);
  void* a = pool.allocate(4096);
  void* b = pool.allocate(4096);
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  try {
    pool.allocate(512);
    FAIL("pool should be exhausted");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("pinned host pool exhausted") != std::string::npos);
  }
  pool.deallocate(a);
  void* c = pool.allocate(4000);  // fits again after a free, reusing the block
  REQUIRE(c == a);
  pool.deallocate(b);
  pool.deallocate(c);
  REQUIRE(pool.stats().allocatedBytes == 0);
  REQUIRE(pool.stats().reservedBytes <= 8192);
}

TEST_CASE("slot arena hands out fixed slots of one contiguous region", "[core][allocator]") {
  SlotArena arena(cpuAllocator(), 1000, 3);
  REQUIRE(arena.slotBytes() == 1024);  // rounded to 256
  int s0 = arena.acquire(), s1 = arena.acquire(), s2 = arena.acquire();
  REQUIRE(s0 == 0);
  REQUIRE(arena.acquire() == -1);
  REQUIRE(static_cast<char*>(arena.slotData(s1)) - static_cast<char*>(arena.slotData(s0)) == 1024);
  REQUIRE(static_cast<char*>(arena.slotData(s2)) - static_cast<char*>(arena.slotData(s0)) == 2048);
  arena.release(s1);
  REQUIRE(arena.freeSlots() == 1);
  REQUIRE(arena.acquire() == s1);
  REQUIRE_THROWS_AS(arena.release(7), Error);
  arena.release(s0);
  REQUIRE_THROWS_AS(arena.release(s0), Error);
}

TEST_CASE("storage can be re-pointed and evicted under its views", "[core][storage]") {
  Tensor t = ops::arange(0, 8).view({2, 4});
  Tensor row = t.select(0, 1);
  std::vector<float> host(8, 3.0f);
  t.storage()->setLabel("chunk0");
  t.storage()->repoint(host.data(), Device::cpu());
  REQUIRE(row.toVector<float>() == std::vector<float>{3, 3, 3, 3});
  host[5] = 9.0f;
  REQUIRE(row.toVector<float>()[1] == 9.0f);
  t.storage()->evict();
  REQUIRE(!t.storage()->resident());
  try {
    row.toVector<float>();
    FAIL("touching an evicted storage must throw");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("chunk0") != std::string::npos);
  }
}

TEST_CASE("cpu allocator counts live bytes", "[core][allocator]") {
  size_t before = cpuAllocator().stats().allocatedBytes;
  {
    Tensor t = Tensor::empty({1000}, DType::F64);
    REQUIRE(cpuAllocator().stats().allocatedBytes >= before + 8000);
  }
  REQUIRE(cpuAllocator().stats().allocatedBytes == before);
}
