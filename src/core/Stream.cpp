#include "strata/core/Stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <unordered_map>
#include <vector>

#include "core/cuda/CudaContext.h"
#include "strata/core/Error.h"

namespace strata {

Stream::Handle::~Handle() {
#if STRATA_CUDA
  if (stream) {
    cuda::DeviceGuard guard(deviceIndex);
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
#endif
}

namespace {
int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Stream Stream::create(Device device) {
  static std::atomic<uint64_t> nextId{1};
  Stream s;
  s.device_ = device;
  auto handle = std::make_shared<Handle>();
  handle->deviceIndex = device.index;
  if (device.isCuda()) {
#if STRATA_CUDA
    cuda::DeviceGuard guard(device.index);
    cudaStream_t raw = nullptr;
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    handle->stream = raw;
#else
    STRATA_FAIL("a CUDA stream was requested, but this build of Strata has no CUDA support");
#endif
  }
  handle->id = nextId.fetch_add(1);
  s.handle_ = std::move(handle);
  return s;
}

void Stream::synchronize() const {
#if STRATA_CUDA
  bindThreadToProcessDevice();
  if (device_.isCuda()) STRATA_CUDA_CHECK(cudaStreamSynchronize(cuda::nativeStream(*this)));
#endif
}

Event::Event(Device device, bool timing) : device_(device) {
#if STRATA_CUDA
  if (device.isCuda()) {
    cuda::DeviceGuard guard(device.index);
    cudaEvent_t e = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    event_ = e;
  }
#else
  (void)timing;
#endif
}

Event::~Event() {
#if STRATA_CUDA
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

Event::Event(Event&& o) noexcept
    : device_(o.device_), event_(o.event_), hostTimeNs_(o.hostTimeNs_.load(std::memory_order_relaxed)) {
  o.event_ = nullptr;
}

Event& Event::operator=(Event&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(event_, o.event_);
  int64_t t = hostTimeNs_.load(std::memory_order_relaxed);
  hostTimeNs_.store(o.hostTimeNs_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  o.hostTimeNs_.store(t, std::memory_order_relaxed);
  return *this;
}

void Event::record(const Stream& stream) {
  STRATA_CHECK(stream.device() == device_, "event on {} recorded on a stream of {}", toString(device_),
               toString(stream.device()));
  hostTimeNs_.store(steadyNowNs(), std::memory_order_release);
#if STRATA_CUDA
  bindThreadToProcessDevice();  // NOTE [Process device]
  if (event_)
    STRATA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), cuda::nativeStream(stream)));
#endif
}

void Event::block(const Stream& stream) const {
#if STRATA_CUDA
  if (!event_) return;  // a CPU event: complete when recorded
  bindThreadToProcessDevice();
  if (stream.device().isCuda()) {
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(cuda::nativeStream(stream), static_cast<cudaEvent_t>(event_), 0));
  } else {
    // A CPU stream runs its work at the call, so its next work may start only once the GPU has reached the
    // event.
    synchronize();
  }
#else
  (void)stream;
#endif
}

void Event::synchronize() const {
#if STRATA_CUDA
  bindThreadToProcessDevice();
  if (event_) STRATA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
#endif
}

bool Event::query() const {
#if STRATA_CUDA
  bindThreadToProcessDevice();
  if (event_) {
    cudaError_t st = cudaEventQuery(static_cast<cudaEvent_t>(event_));
    if (st == cudaErrorNotReady) return false;
    STRATA_CUDA_CHECK(st);
  }
#endif
  return true;
}

float Event::elapsedMs(const Event& end) const {
#if STRATA_CUDA
  if (event_ && end.event_) {
    float ms = 0;
    STRATA_CUDA_CHECK(
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(event_), static_cast<cudaEvent_t>(end.event_)));
    return ms;
  }
#endif
  int64_t ns = end.hostTimeNs_.load(std::memory_order_acquire) - hostTimeNs_.load(std::memory_order_acquire);
  return float(double(ns) / 1e6);
}

DeviceStreams DeviceStreams::create(Device device) {
  return DeviceStreams{device.isCpu() ? Stream() : Stream::create(device), Stream::create(device),
                       Stream::create(device), Stream::create(device), Stream::create(device)};
}

const DeviceStreams& deviceStreams(Device device) {
  if (device.isCpu()) {
    static const DeviceStreams* cpu = new DeviceStreams(DeviceStreams::create(Device::cpu()));  // never freed
    return *cpu;
  }
#if STRATA_CUDA
  return cuda::deviceContext(device.index).streams;
#else
  STRATA_FAIL("device {} requested, but this build of Strata has no CUDA support", toString(device));
#endif
}

namespace {
std::unordered_map<int, Stream>& streamOverrides() {
  thread_local std::unordered_map<int, Stream> overrides;
  return overrides;
}
int overrideKey(Device d) {
  return d.isCpu() ? -1 : d.index;
}
}  // namespace

Stream currentStream(Device device) {
  auto& overrides = streamOverrides();
  auto it = overrides.find(overrideKey(device));
  if (it != overrides.end()) return it->second;
  if (device.isCpu()) return Stream();
#if STRATA_CUDA
  return cuda::deviceContext(device.index).streams.compute;
#else
  STRATA_FAIL("device {} requested, but this build of Strata has no CUDA support", toString(device));
#endif
}

StreamGuard::StreamGuard(const Stream& stream) : key_(overrideKey(stream.device())) {
  auto& overrides = streamOverrides();
  auto it = overrides.find(key_);
  hadPrevious_ = it != overrides.end();
  if (hadPrevious_) previous_ = it->second;
  overrides[key_] = stream;
}

StreamGuard::~StreamGuard() {
  auto& overrides = streamOverrides();
  if (hadPrevious_) {
    overrides[key_] = previous_;
  } else {
    overrides.erase(key_);
  }
}

void synchronizeDevice(Device device) {
#if STRATA_CUDA
  if (device.isCuda()) {
    cuda::DeviceGuard guard(device.index);
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  }
#else
  (void)device;
#endif
}

void streamWaits(const Stream& waiter, const Stream& producer, Device device) {
  Event done(device);
  done.record(producer);
  done.block(waiter);
}

double medianEventMs(Device device, const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  Stream stream = currentStream(device);
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    Event start(device, true), stop(device, true);
    start.record(stream);
    fn();
    stop.record(stream);
    stop.synchronize();
    times.push_back(start.elapsedMs(stop));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace strata
