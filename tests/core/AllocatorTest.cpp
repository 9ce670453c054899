#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "TestUtil.h"
#include "core/ManualFences.h"

using namespace strata;
using strata::test::ManualFences;

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
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "test");
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
  BlockCachingAllocator alloc(Device::cpu(), raw, "bounded");
  void* a = alloc.allocate(2048);
  void* b = alloc.allocate(2048);
  alloc.deallocate(a);
  alloc.deallocate(b);
  REQUIRE(alloc.stats().reservedBytes == 4096);
  REQUIRE(alloc.stats().numRawFailures == 0);
  void* c = alloc.allocate(6144);  // only fits once the two cached blocks are returned
  REQUIRE(c != nullptr);
  REQUIRE(alloc.stats().reservedBytes == 6144);
  // NOTE [Fragmentation]: one failed raw call, one flush of the cache, and the retry served it.
  AllocatorStats s = alloc.stats();
  REQUIRE(s.numRawFailures == 1);
  REQUIRE(s.numCacheFlushes == 1);
  REQUIRE(s.numFailedAllocations == 0);
  try {
    alloc.allocate(4096);
    FAIL("allocation beyond the budget must fail");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("out of memory") != std::string::npos);
  }
  // Nothing cached to give back: two failed raw calls (the first and the retry), no flush, and the
  // request failed.
  s = alloc.stats();
  REQUIRE(s.numRawFailures == 3);
  REQUIRE(s.numCacheFlushes == 1);
  REQUIRE(s.numFailedAllocations == 1);
  alloc.deallocate(c);
}

TEST_CASE("caching allocator reports its reserve's peak beyond the most it handed out at once",
          "[core][allocator]") {
  CountingRaw counter;
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "fragments");
  // Two 1 KiB blocks cached, then a 2 KiB request they cannot serve (the wrong size): the reserve grows
  // to 4 KiB while no more than 2 KiB were ever handed out at once.
  void* a = alloc.allocate(1024);
  void* b = alloc.allocate(1024);
  alloc.deallocate(a);
  alloc.deallocate(b);
  void* c = alloc.allocate(2048);
  AllocatorStats s = alloc.stats();
  REQUIRE(s.peakReservedBytes == 4096);
  REQUIRE(s.peakAllocatedBytes == 2048);
  REQUIRE(s.fragmentedAtPeakBytes() == 2048);
  // Using the cached blocks lowers it: the reserve turns out to be needed.
  void* d = alloc.allocate(1024);
  REQUIRE(alloc.stats().fragmentedAtPeakBytes() == 1024);
  void* e = alloc.allocate(1024);
  REQUIRE(alloc.stats().fragmentedAtPeakBytes() == 0);
  void* f = alloc.allocate(1024);  // the cache is spent: the reserve grows with nothing unused
  s = alloc.stats();
  REQUIRE(s.peakReservedBytes == 5120);
  REQUIRE(s.peakAllocatedBytes == 5120);
  REQUIRE(s.fragmentedAtPeakBytes() == 0);
  REQUIRE(s.numRawFailures == 0);
  for (void* p : {c, d, e, f}) alloc.deallocate(p);
  alloc.resetPeakStats();
  REQUIRE(alloc.stats().fragmentedAtPeakBytes() == alloc.stats().reservedBytes);
}

TEST_CASE("the cpu allocator's reserve is what it hands out: no fragmentation", "[core][allocator]") {
  Allocator& cpu = cpuAllocator();
  cpu.resetPeakStats();
  void* p = cpu.allocate(1 << 20);
  AllocatorStats s = cpu.stats();
  REQUIRE(s.peakReservedBytes >= (1u << 20));
  REQUIRE(s.fragmentedAtPeakBytes() == 0);
  cpu.deallocate(p);
}

TEST_CASE("caching allocator hands a freed block only to its own stream", "[core][allocator][stream]") {
  ManualFences fences;
  CountingRaw counter;
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "streams",
                              CachingAllocatorOptions{SIZE_MAX, fences.factory()});
  Stream s1 = Stream::create(Device::cpu()), s2 = Stream::create(Device::cpu());
  void* a = alloc.allocate(1000, s1);
  alloc.recordStream(a, s1);  // its own stream: nothing to track
  alloc.deallocate(a);
  // Another stream's work is not ordered after the free: it gets new memory.
  void* b = alloc.allocate(1000, s2);
  REQUIRE(b != a);
  // The block's own stream reuses it at once, with no fence and no wait: the cheap path.
  void* c = alloc.allocate(1000, s1);
  REQUIRE(c == a);
  REQUIRE(fences.made.empty());
  REQUIRE(alloc.stats().numDeferredFrees == 0);
  // allocate(bytes) uses the current stream.
  alloc.deallocate(c);
  {
    StreamGuard guard(s1);
    REQUIRE(alloc.hasCachedFit(1000));
    REQUIRE(alloc.allocate(1000) == a);
  }
  alloc.deallocate(a);
  alloc.deallocate(b);
}

TEST_CASE("a block freed while other streams use it waits for their fences", "[core][allocator][stream]") {
  ManualFences fences;
  CountingRaw counter;
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "streams",
                              CachingAllocatorOptions{SIZE_MAX, fences.factory()});
  Stream mine = Stream::create(Device::cpu()), reader = Stream::create(Device::cpu()),
         writer = Stream::create(Device::cpu());
  void* a = alloc.allocate(4096, mine);
  alloc.recordStream(a, reader);
  alloc.recordStream(a, reader);  // recorded once
  alloc.recordStream(a, writer);
  REQUIRE(fences.made.empty());  // fences are made at the free, not before
  alloc.deallocate(a);
  REQUIRE(fences.made.size() == 2);
  REQUIRE(fences.made[0]->stream == reader.id());
  REQUIRE(fences.made[1]->stream == writer.id());
  AllocatorStats s = alloc.stats();
  REQUIRE(s.pendingBytes == 4096);
  REQUIRE(s.allocatedBytes == 0);
  REQUIRE(s.reservedBytes == 4096);
  REQUIRE(s.numDeferredFrees == 1);
  // Neither stream is done: the block is not handed out, not even to its own stream.
  void* b = alloc.allocate(4096, mine);
  REQUIRE(b != a);
  alloc.deallocate(b);  // b is now cached on `mine`; take it again so the next check sees only `a`
  REQUIRE(alloc.allocate(4096, mine) == b);
  fences.made[0]->complete = true;
  void* c = alloc.allocate(4096, mine);
  REQUIRE(c != a);  // the writer is still running
  fences.made[1]->complete = true;
  void* d = alloc.allocate(4096, mine);
  REQUIRE(d == a);
  REQUIRE(alloc.stats().pendingBytes == 0);
  REQUIRE(fences.waits == 0);  // polled, never waited on
  for (void* p : {b, c, d}) alloc.deallocate(p);
  alloc.emptyCache();
  REQUIRE(alloc.stats().reservedBytes == 0);
  REQUIRE(counter.frees == counter.allocs);
}

TEST_CASE("an allocator out of memory waits for pending blocks before it fails",
          "[core][allocator][stream]") {
  ManualFences fences;
  CountingRaw counter;
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "bounded",
                              CachingAllocatorOptions{8192, fences.factory()});
  Stream mine = Stream::create(Device::cpu()), reader = Stream::create(Device::cpu());
  void* a = alloc.allocate(8192, mine);
  alloc.recordStream(a, reader);
  alloc.deallocate(a);
  REQUIRE(alloc.stats().pendingBytes == 8192);
  // No room to grow: the allocator waits for the reader, then reuses the block.
  void* b = alloc.allocate(8192, mine);
  REQUIRE(b == a);
  REQUIRE(fences.waits == 1);
  AllocatorStats s = alloc.stats();
  REQUIRE(s.allocatedBytes == 8192);
  REQUIRE(s.reservedBytes == 8192);
  REQUIRE(s.pendingBytes == 0);
  REQUIRE(s.numRawAllocations == 1);
  REQUIRE(alloc.tryAllocate(512, mine) == nullptr);
  std::string error = test::errorOf([&] { alloc.allocate(512, mine); });
  REQUIRE(error.find("out of memory") != std::string::npos);
  // A pending block of another stream is waited for and then released to make room.
  alloc.recordStream(b, reader);
  alloc.deallocate(b);
  Stream other = Stream::create(Device::cpu());
  void* c = alloc.allocate(4096, other);
  REQUIRE(c != nullptr);
  REQUIRE(fences.waits == 2);
  REQUIRE(alloc.stats().reservedBytes == 4096);
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
    REQUIRE(std::string(e.what()).find("out of memory: the pinned host pool") != std::string::npos);
  }
  pool.deallocate(a);
  void* c = pool.allocate(4000);  // fits again after a free, reusing the block
  REQUIRE(c == a);
  pool.deallocate(b);
  pool.deallocate(c);
  REQUIRE(pool.stats().allocatedBytes == 0);
  REQUIRE(pool.stats().reservedBytes <= 8192);
}

namespace {
// Raw memory that tracks the bytes it has handed out and their peak, and is slow to allocate (as
// cudaHostAlloc is), which widens any race between checking the budget and allocating.
struct BudgetWatch {
  std::atomic<size_t> live{0}, peak{0};
  std::atomic<int> allocs{0}, frees{0};
  std::mutex sizesMutex;
  std::map<void*, size_t> sizes;
  RawMemory raw() {
    return RawMemory{[this](size_t b) -> void* {
                       std::this_thread::sleep_for(std::chrono::microseconds(20));
                       void* p = std::malloc(b);
                       {
                         std::lock_guard<std::mutex> lock(sizesMutex);
                         sizes[p] = b;
                       }
                       size_t now = live += b;
                       size_t old = peak.load();
                       while (now > old && !peak.compare_exchange_weak(old, now)) {
                       }
                       allocs++;
                       return p;
                     },
                     [this](void* p) {
                       size_t b;
                       {
                         std::lock_guard<std::mutex> lock(sizesMutex);
                         b = sizes.at(p);
                         sizes.erase(p);
                       }
                       live -= b;
                       frees++;
                       std::free(p);
                     }};
  }
};
}  // namespace

TEST_CASE("pinned host pool releases cached blocks before it grows past its budget", "[core][allocator]") {
  BudgetWatch watch;
  ManualFences fences;
  PinnedHostPool pool(8192, watch.raw(), fences.factory());
  void* a = pool.allocate(4096);
  pool.deallocate(a);
  REQUIRE(pool.stats().reservedBytes == 4096);  // cached
  // 6144 bytes do not fit the cached block; cached + new would pass the budget, so the cache goes first.
  void* b = pool.allocate(6144);
  REQUIRE(watch.frees == 1);
  REQUIRE(pool.stats().reservedBytes == 6144);
  REQUIRE(watch.peak <= 8192);
  // Held blocks count: 6144 + 4096 > 8192.
  std::string error = test::errorOf([&] { pool.allocate(4096); });
  REQUIRE(error.find("out of memory: the pinned host pool") != std::string::npos);
  // A block a GPU stream still reads counts too: the pool waits for that stream, then reuses the block.
  Stream copyStream = Stream::create(Device::cpu());
  pool.recordStream(b, copyStream);
  pool.deallocate(b);
  REQUIRE(pool.stats().pendingBytes == 6144);
  void* c = pool.allocate(4096);
  REQUIRE(fences.waits == 1);
  REQUIRE(c == b);
  REQUIRE(watch.peak <= 8192);
  pool.deallocate(c);
}

TEST_CASE("pinned host pool stays within its budget under concurrent use", "[core][allocator]") {
  // Threads allocate, fill, check and free blocks of mixed sizes. The pool's raw memory never passes the
  // capacity, cached blocks included, and no two threads ever hold the same bytes.
  constexpr size_t kCapacity = 64u << 10;
  constexpr int kThreads = 4, kIterations = 1500;
  BudgetWatch watch;
  PinnedHostPool pool(kCapacity, watch.raw());
  std::atomic<int> exhausted{0}, otherErrors{0}, corrupted{0}, served{0};
  auto work = [&](int thread) {
    std::mt19937 rng(uint32_t(thread) * 7919u + 1);
    std::vector<std::pair<uint8_t*, size_t>> held;
    auto release = [&](size_t i) {
      auto [p, n] = held[i];
      int wrong = 0;
      for (size_t j = 0; j < n; ++j) wrong += p[j] != uint8_t(thread * 31 + int(n));
      corrupted += wrong;
      pool.deallocate(p);
      held.erase(held.begin() + std::ptrdiff_t(i));
    };
    for (int it = 0; it < kIterations; ++it) {
      if (!held.empty() && (held.size() >= 3 || rng() % 2 == 0)) release(rng() % held.size());
      size_t n = 512 + rng() % (20u << 10);
      try {
        auto* p = static_cast<uint8_t*>(pool.allocate(n));
        std::memset(p, thread * 31 + int(n), n);
        held.emplace_back(p, n);
        served++;
      } catch (const Error& e) {
        if (std::string(e.what()).find("out of memory: the pinned host pool") != std::string::npos)
          exhausted++;
        else
          otherErrors++;
      }
    }
    while (!held.empty()) release(0);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(work, t);
  for (auto& t : threads) t.join();
  INFO("served " << served << ", exhausted " << exhausted << ", raw allocations " << watch.allocs);
  REQUIRE(otherErrors == 0);
  REQUIRE(corrupted == 0);
  REQUIRE(served > 0);
  REQUIRE(watch.peak <= kCapacity);
  AllocatorStats s = pool.stats();
  REQUIRE(s.allocatedBytes == 0);
  REQUIRE(s.reservedBytes <= kCapacity);
  REQUIRE(s.peakReservedBytes <= kCapacity);
  REQUIRE(s.reservedBytes == watch.live);
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

TEST_CASE("moving a storage's bytes changes its residency, not its content version", "[core][storage]") {
  Tensor t = ops::arange(0, 8);
  StorageImpl& s = *t.storage();
  uint64_t version = s.version(), residency = s.residencyVersion();
  std::vector<float> moved = t.toVector<float>();
  s.evict();
  REQUIRE(s.residencyVersion() == residency + 1);
  s.repoint(moved.data(), Device::cpu());
  REQUIRE(s.residencyVersion() == residency + 2);
  REQUIRE(s.version() == version);
  // Writes still count.
  ops::fill(t, 1.0);
  REQUIRE(s.version() > version);
  REQUIRE(s.residencyVersion() == residency + 2);
  REQUIRE(moved[3] == 1.0f);
  uint64_t afterFill = s.version();
  ops::copy(t, ops::zeros({8}));
  REQUIRE(s.version() > afterFill);
}

TEST_CASE("storage names its stream uses to the allocator that owns it", "[core][storage][stream]") {
  ManualFences fences;
  CountingRaw counter;
  BlockCachingAllocator alloc(Device::cpu(), counter.raw(), "storage",
                              CachingAllocatorOptions{SIZE_MAX, fences.factory()});
  Stream reader = Stream::create(Device::cpu());
  void* block = nullptr;
  {
    StorageImpl owned(4096, alloc);
    block = owned.data();
    owned.recordStream(reader);
  }  // freed here: the reader's fence is pending
  REQUIRE(fences.made.size() == 1);
  REQUIRE(alloc.stats().pendingBytes == 4096);
  void* fresh = alloc.allocate(4096, Stream());
  REQUIRE(fresh != block);
  alloc.deallocate(fresh);
  // A storage that does not own its bytes has no allocator to tell.
  std::vector<char> user(64);
  StorageImpl borrowed(user.data(), user.size(), Device::cpu());
  borrowed.recordStream(reader);
  REQUIRE(fences.made.size() == 1);
}

TEST_CASE("cpu allocator counts live bytes", "[core][allocator]") {
  size_t before = cpuAllocator().stats().allocatedBytes;
  {
    Tensor t = Tensor::empty({1000}, DType::F64);
    REQUIRE(cpuAllocator().stats().allocatedBytes >= before + 8000);
  }
  REQUIRE(cpuAllocator().stats().allocatedBytes == before);
}

#if STRATA_CUDA
#include <cuda_runtime.h>

namespace {
// Holds a CUDA stream at a host function until open(): nothing enqueued on the stream after the gate runs
// before the test says so. This makes "the other stream is still busy" deterministic.
class StreamGate {
 public:
  explicit StreamGate(const Stream& stream) : stream_(stream) {
    REQUIRE(cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native()), &StreamGate::hold, &open_) ==
            cudaSuccess);
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_.native()));
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() { open_.store(true); }

 private:
  static void hold(void* flag) {
    auto* open = static_cast<std::atomic<bool>*>(flag);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);  // never hang the suite
    while (!open->load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  Stream stream_;
  std::atomic<bool> open_{false};
};
}  // namespace
#endif

TEST_CASE("[cuda] a block another stream still reads is not reused before that stream is done",
          "[cuda][allocator][stream]") {
  STRATA_REQUIRE_CUDA();
#if STRATA_CUDA
  Device gpu = Device::cuda(0);
  auto& alloc = dynamic_cast<CachingAllocator&>(deviceAllocator(gpu));
  // Fresh streams, so their pools start empty and pointer identity means what it says.
  Stream mine = Stream::create(gpu), reader = Stream::create(gpu);
  auto native = [](const Stream& s) { return static_cast<cudaStream_t>(s.native()); };
  constexpr size_t kBytes = 6u << 20;
  void* block = alloc.allocate(kBytes, mine);
  // A second block cached on `mine` now, so that no cudaMalloc (which may synchronise the device, and so
  // wait for the gated reader) runs while the gate is closed.
  void* spare = alloc.allocate(kBytes, mine);
  alloc.deallocate(spare);
  Tensor out = Tensor::empty({int64_t(kBytes)}, DType::U8, gpu);
  REQUIRE(cudaMemsetAsync(block, 7, kBytes, native(mine)) == cudaSuccess);
  Event filled(gpu);
  filled.record(mine);
  filled.block(reader);
  synchronizeDevice(gpu);  // `out` is allocated and idle; only the gate holds the reader below
  AllocatorStats before = alloc.stats();
  {
    StreamGate gate(reader);
    copyAsync(out.data(), gpu, block, gpu, kBytes, reader);  // reads the block once the gate opens
    alloc.recordStream(block, reader);
    alloc.deallocate(block);
    AllocatorStats freed = alloc.stats();
    REQUIRE(freed.pendingBytes == before.pendingBytes + kBytes);
    REQUIRE(freed.numDeferredFrees == before.numDeferredFrees + 1);
    // The reader has not run: the block's own stream gets other memory, and writing it cannot reach the
    // bytes the reader will read.
    void* next = alloc.allocate(kBytes, mine);
    REQUIRE(next != block);
    REQUIRE(next == spare);
    REQUIRE(cudaMemsetAsync(next, 9, kBytes, native(mine)) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(native(mine)) == cudaSuccess);
    REQUIRE(alloc.stats().pendingBytes == before.pendingBytes + kBytes);
    gate.open();
    reader.synchronize();
    // The reader is done: the next allocation on `mine` gets the block back.
    void* again = alloc.allocate(kBytes, mine);
    REQUIRE(again == block);
    REQUIRE(alloc.stats().pendingBytes == before.pendingBytes);
    alloc.deallocate(next);
    alloc.deallocate(again);
  }
  std::vector<uint8_t> copied(kBytes);
  copyBytes(copied.data(), Device::cpu(), out.data(), gpu, kBytes);
  REQUIRE(std::count(copied.begin(), copied.end(), uint8_t(7)) == std::ptrdiff_t(kBytes));
#endif
}

TEST_CASE("the host state allocator gives page-aligned blocks of their own and counts them", "[allocator]") {
  // NOTE [Host state memory]: no two blocks share a page, so each can be page-locked on its own.
  Allocator& a = hostStateAllocator(false);
  size_t before = a.stats().allocatedBytes;
  void* p = a.allocate(10);
  void* q = a.allocate(5000);
  REQUIRE(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  REQUIRE(reinterpret_cast<uintptr_t>(q) % 4096 == 0);
  REQUIRE(a.stats().allocatedBytes == before + 4096 + 8192);
  std::memset(q, 1, 5000);
  a.deallocate(p);
  a.deallocate(q);
  REQUIRE(a.stats().allocatedBytes == before);
  REQUIRE(a.device() == Device::cpu());
  REQUIRE_FALSE(isPageLocked(q));  // no GPU in this check, or freed
}

TEST_CASE("out of memory names the memory, the bytes and what they were for", "[core][allocator]") {
  // NOTE [Out of memory]
  PinnedHostPool pool(8192);
  void* a = pool.allocate(8192);
  {
    MemoryPurpose outer("optimizer state");
    MemoryPurpose inner("a staging buffer");
    CHECK(std::string(MemoryPurpose::current()) == "a staging buffer");
    try {
      pool.allocate(4096);
      FAIL("the pool should be exhausted");
    } catch (const OutOfMemory& e) {
      CHECK(e.userFacing());
      CHECK(e.purpose() == "a staging buffer");
      CHECK(e.bytes() >= 4096);
      CHECK(e.device() == Device::cpu());
      CHECK(e.message().find("out of memory: the pinned host pool") != std::string::npos);
      CHECK(e.message().find("for a staging buffer") != std::string::npos);
      CHECK(e.figures().find("8192 of 8192 bytes in use") != std::string::npos);
    }
  }
  CHECK(MemoryPurpose::current() == nullptr);
  pool.deallocate(a);
  // The host allocator: an impossible request is OutOfMemory too, not a check failure.
  std::string huge = test::errorOf([] { cpuAllocator().allocate(size_t(1) << 62); });
  CHECK(huge.find("out of memory: host memory could not give") != std::string::npos);
  CHECK(huge.find("check failed") == std::string::npos);
}
