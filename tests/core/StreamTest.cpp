#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "TestUtil.h"

using namespace strata;

TEST_CASE("cpu streams and events run synchronously", "[core][stream]") {
  DeviceStreams streams = DeviceStreams::create(Device::cpu());
  REQUIRE(streams.compute.native() == nullptr);
  Event start(Device::cpu(), true), stop(Device::cpu(), true);
  start.record(streams.h2d);
  Tensor t = ops::ones({256});
  stop.record(streams.h2d);
  stop.block(streams.compute);
  REQUIRE(stop.query());
  stop.synchronize();
  REQUIRE(start.elapsedMs(stop) >= 0.0f);
  REQUIRE(ops::sum(t).item() == 256.0);
}

TEST_CASE("stream guard sets and restores the current stream", "[core][stream]") {
  Stream before = currentStream(Device::cpu());
  {
    Stream s = Stream::create(Device::cpu());
    StreamGuard guard(s);
    REQUIRE(currentStream(Device::cpu()) == s);
    REQUIRE(!(currentStream(Device::cpu()) == before));
  }
  REQUIRE(currentStream(Device::cpu()) == before);
}

TEST_CASE("each device has five streams, and the compute stream is the current one by default",
          "[core][stream]") {
  const DeviceStreams& cpu = deviceStreams(Device::cpu());
  REQUIRE(&cpu == &deviceStreams(Device::cpu()));  // made once
  REQUIRE(currentStream(Device::cpu()) == cpu.compute);
  std::vector<uint64_t> ids{cpu.compute.id(), cpu.h2d.id(), cpu.d2h.id(), cpu.comm.id(), cpu.gather.id()};
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = i + 1; j < ids.size(); ++j) REQUIRE(ids[i] != ids[j]);
  // Stream ids are never reused, so an allocator pool keyed by a dead stream's id is never handed to a new
  // stream.
  uint64_t dead = Stream::create(Device::cpu()).id();
  REQUIRE(Stream::create(Device::cpu()).id() > dead);
}

TEST_CASE("copyAsync on the cpu copies before it returns and refuses foreign streams", "[core][stream]") {
  std::vector<float> src{1, 2, 3, 4}, dst(4, 0.0f);
  copyAsync(dst.data(), Device::cpu(), src.data(), Device::cpu(), 4 * sizeof(float),
            deviceStreams(Device::cpu()).h2d);
  REQUIRE(dst == src);
  copyAsync(dst.data(), Device::cpu(), src.data(), Device::cpu(), 0, Stream());  // nothing to do
  if (cudaAvailable()) {
    REQUIRE_THROWS_AS(copyAsync(dst.data(), Device::cpu(), src.data(), Device::cpu(), 16,
                                deviceStreams(Device::cuda(0)).h2d),
                      Error);
  }
}

TEST_CASE("events order a producer thread's copies before a consumer thread's reads", "[core][stream]") {
  // The producer fills buffer i on the h2d stream and records event i, then hands i over through a queue
  // (as with CUDA, the consumer must see the record before it waits: see NOTE [Event ordering across
  // streams and threads]). The consumer blocks its compute stream on the event and copies the buffer out on
  // it. Checked on the main thread: every copy saw the producer's bytes, and every consumer record came
  // after the producer record it waited for.
  constexpr int kItems = 200;
  constexpr size_t kFloats = 4096;
  const DeviceStreams& streams = deviceStreams(Device::cpu());
  std::vector<std::vector<float>> staged(kItems, std::vector<float>(kFloats, 0.0f));
  std::vector<std::vector<float>> seen(kItems, std::vector<float>(kFloats, -1.0f));
  std::vector<Event> produced, consumed;
  for (int i = 0; i < kItems; ++i) {
    produced.emplace_back(Device::cpu(), true);
    consumed.emplace_back(Device::cpu(), true);
  }
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<int> queue;

  std::thread producer([&] {
    std::vector<float> pattern(kFloats);
    for (int i = 0; i < kItems; ++i) {
      for (size_t j = 0; j < kFloats; ++j) pattern[j] = float(i * 10000 + int(j));
      copyAsync(staged[size_t(i)].data(), Device::cpu(), pattern.data(), Device::cpu(),
                kFloats * sizeof(float), streams.h2d);
      produced[size_t(i)].record(streams.h2d);
      {
        std::lock_guard<std::mutex> lock(mutex);
        queue.push_back(i);
      }
      ready.notify_one();
    }
  });
  std::thread consumer([&] {
    Stream compute = Stream::create(Device::cpu());
    for (int n = 0; n < kItems; ++n) {
      int i;
      {
        std::unique_lock<std::mutex> lock(mutex);
        ready.wait(lock, [&] { return !queue.empty(); });
        i = queue.front();
        queue.pop_front();
      }
      produced[size_t(i)].block(compute);
      copyAsync(seen[size_t(i)].data(), Device::cpu(), staged[size_t(i)].data(), Device::cpu(),
                kFloats * sizeof(float), compute);
      consumed[size_t(i)].record(compute);
    }
  });
  producer.join();
  consumer.join();

  int wrong = 0;
  for (int i = 0; i < kItems; ++i) {
    REQUIRE(produced[size_t(i)].query());
    REQUIRE(consumed[size_t(i)].query());
    for (size_t j = 0; j < kFloats; ++j) wrong += seen[size_t(i)][j] != float(i * 10000 + int(j));
    REQUIRE(produced[size_t(i)].elapsedMs(consumed[size_t(i)]) >= 0.0f);
    if (i > 0) REQUIRE(produced[size_t(i) - 1].elapsedMs(produced[size_t(i)]) >= 0.0f);
  }
  REQUIRE(wrong == 0);
}

// GPU
TEST_CASE("[cuda] streams order work across the four device streams", "[cuda][stream]") {
  STRATA_REQUIRE_CUDA();
  Device gpu = Device::cuda(0);
  DeviceStreams streams = DeviceStreams::create(gpu);
  Tensor host = ops::arange(0, 1 << 20);
  Tensor dev = Tensor::empty(host.shape(), DType::F32, gpu);
  Event copied(gpu);
  {
    StreamGuard guard(streams.h2d);
    ops::copy(dev, host);
    copied.record(streams.h2d);
  }
  copied.block(streams.compute);
  StreamGuard guard(streams.compute);
  Tensor doubled = ops::affine(dev, 2.0, 0.0);
  REQUIRE(ops::sum(doubled).to(Device::cpu()).item() ==
          Approx(double(1 << 20) * ((1 << 20) - 1)).epsilon(1e-5));
}

TEST_CASE("[cuda] copyAsync moves pinned memory both ways and refuses pageable memory", "[cuda][stream]") {
  STRATA_REQUIRE_CUDA();
  Device gpu = Device::cuda(0);
  const DeviceStreams& streams = deviceStreams(gpu);
  constexpr size_t kBytes = 8u << 20;
  PinnedHostPool pool(2 * kBytes);
  REQUIRE(pool.isPageLocked());
  auto* up = static_cast<uint8_t*>(pool.allocate(kBytes));
  auto* down = static_cast<uint8_t*>(pool.allocate(kBytes));
  REQUIRE(isPageLocked(up, kBytes));
  for (size_t i = 0; i < kBytes; ++i) up[i] = uint8_t(i * 7 + 3);
  std::memset(down, 0, kBytes);
  Tensor dev = Tensor::empty({int64_t(kBytes)}, DType::U8, gpu);
  copyAsync(dev.data(), gpu, up, Device::cpu(), kBytes, streams.h2d);
  Event landed(gpu);
  landed.record(streams.h2d);
  landed.block(streams.d2h);
  copyAsync(down, Device::cpu(), dev.data(), gpu, kBytes, streams.d2h);
  streams.d2h.synchronize();
  REQUIRE(std::memcmp(up, down, kBytes) == 0);

  std::vector<uint8_t> pageable(kBytes);
  REQUIRE(!isPageLocked(pageable.data()));
  std::string error =
      test::errorOf([&] { copyAsync(dev.data(), gpu, pageable.data(), Device::cpu(), kBytes, streams.h2d); });
  REQUIRE(error.find("pageable") != std::string::npos);
  error = test::errorOf([&] { copyAsync(pageable.data(), Device::cpu(), dev.data(), gpu, 64, streams.d2h); });
  REQUIRE(error.find("pageable") != std::string::npos);
  // A stream of a device the copy does not involve.
  REQUIRE_THROWS_AS(copyAsync(dev.data(), gpu, up, Device::cpu(), 64, Stream()), Error);
  pool.deallocate(up);
  pool.deallocate(down);
}

TEST_CASE("[cuda] a pinned H2D copy on the h2d stream overlaps a GEMM on the compute stream",
          "[cuda][stream]") {
  STRATA_REQUIRE_CUDA();
  Device gpu = Device::cuda(0);
  const DeviceStreams& streams = deviceStreams(gpu);
  StreamGuard onCompute(streams.compute);
  constexpr size_t kBytes = 256u << 20;
  constexpr int64_t kN = 8192;
  constexpr int kGemms = 3;  // ~4-5 ms of bf16 GEMM on an H200, about as long as the copy

  PinnedHostPool pool(kBytes);
  REQUIRE(pool.isPageLocked());
  auto* host = static_cast<uint32_t*>(pool.allocate(kBytes));
  const size_t words = kBytes / sizeof(uint32_t);
  for (size_t i = 0; i < words; ++i) host[i] = uint32_t(i) * 2654435761u;
  Tensor dev = Tensor::empty({int64_t(words)}, DType::I32, gpu);

  // C = A I: a full-size GEMM whose exact result is known (one product per output, accumulated in fp32).
  Generator gen(7);
  Tensor a = ops::randn({kN, kN}, gen, DType::BF16, gpu);
  Tensor eye = ops::zeros({kN, kN}, DType::BF16, gpu);
  ops::fill(Tensor::fromStorage(eye.storage(), {kN}, {kN + 1}, 0, DType::BF16), 1.0);
  Tensor c;
  auto gemms = [&] {
    for (int i = 0; i < kGemms; ++i) c = ops::matmul(a, eye);
  };
  auto copy = [&] { copyAsync(dev.data(), gpu, host, Device::cpu(), kBytes, streams.h2d); };
  auto copyLanded = [&] {
    std::vector<uint32_t> back(words);
    copyBytes(back.data(), Device::cpu(), dev.data(), gpu, kBytes);
    return std::memcmp(back.data(), host, kBytes) == 0;
  };
  gemms();  // warm-up: plans, workspace
  copy();
  synchronizeDevice(gpu);

  Event c0(gpu, true), c1(gpu, true), g0(gpu, true), g1(gpu, true), start(gpu, true), stop(gpu, true);
  Event copyDone(gpu);
  c0.record(streams.h2d);
  copy();
  c1.record(streams.h2d);
  c1.synchronize();
  float copyMs = c0.elapsedMs(c1);
  g0.record(streams.compute);
  gemms();
  g1.record(streams.compute);
  g1.synchronize();
  float gemmMs = g0.elapsedMs(g1);

  ops::fill(dev, 0.0);
  synchronizeDevice(gpu);
  start.record(streams.compute);
  start.block(streams.h2d);
  copy();
  copyDone.record(streams.h2d);
  gemms();
  copyDone.block(streams.compute);
  stop.record(streams.compute);
  stop.synchronize();
  float bothMs = start.elapsedMs(stop);

  std::printf(
      "[cuda] overlap: pinned H2D copy of %zu MiB alone %.3f ms (%.1f GB/s), %d bf16 GEMMs %ld^3 alone "
      "%.3f ms, both on two streams %.3f ms (serial would be %.3f ms)\n",
      kBytes >> 20, copyMs, double(kBytes) / (copyMs * 1e-3) / 1e9, kGemms, long(kN), gemmMs, bothMs,
      copyMs + gemmMs);
  REQUIRE(copyLanded());
  Tensor mismatches = ops::sum(ops::affine(ops::eq(c, a), -1.0, 1.0), {}, false, DType::F32);
  REQUIRE(mismatches.to(Device::cpu()).item() == 0.0);
  if (bothMs > 0.9f * (copyMs + gemmMs))
    WARN("no overlap seen: both took " << bothMs << " ms, the copy " << copyMs << " ms and the GEMMs "
                                       << gemmMs << " ms alone");
  pool.deallocate(host);
}
