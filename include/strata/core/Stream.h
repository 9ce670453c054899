// Streams and events. Each device has five streams (compute, H2D, D2H, comm, gather) ordered with events. On
// the CPU the same API runs synchronously: work is done when the call returns, events are always complete.
// This lets the overlap logic of the store and the optimizer run, unchanged, in CPU tests.
//
// NOTE [Event ordering across streams and threads]
// An event marks the point of a stream at which it was recorded: `e.record(s1); e.block(s2)` makes work
// enqueued on s2 after the block() wait for everything enqueued on s1 before the record(). As in CUDA, a
// wait refers to the latest record() that happened before it on the host: a consumer thread must see the
// producer's record() (through a queue, a future, a lock) before it blocks on the event. An event that was
// never recorded is complete. Event and Stream are safe to use from several threads; one Event may be
// recorded by one thread while others query or wait on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "strata/core/Device.h"

namespace strata {

class Stream {
 public:
  Stream() = default;  // the default CPU stream (id 0)
  // A new stream on `device`: a non-blocking CUDA stream, or a CPU stream with its own id (work on it is
  // still done when the call returns).
  static Stream create(Device device);
  Device device() const { return device_; }
  // cudaStream_t of a CUDA stream, nullptr on the CPU.
  void* native() const { return handle_ ? handle_->stream : nullptr; }
  // Unique in the process and never reused, even after the stream is destroyed; 0 for the default CPU
  // stream. The caching allocator keys its pools by it.
  uint64_t id() const { return handle_ ? handle_->id : 0; }
  void synchronize() const;
  bool operator==(const Stream& o) const { return id() == o.id(); }

 private:
  struct Handle {
    void* stream = nullptr;
    int deviceIndex = 0;
    uint64_t id = 0;
    ~Handle();
  };
  Device device_;
  std::shared_ptr<Handle> handle_;
};

class Event {
 public:
  explicit Event(Device device = Device::cpu(), bool timing = false);
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  // Marks the current end of `stream`, which must be on this event's device.
  void record(const Stream& stream);
  // Makes later work on `stream` wait until this event completes. A CUDA stream waits on the GPU (the host
  // does not block; the stream may be on another GPU). A CPU stream runs its work when the call is made, so
  // blocking it on a CUDA event waits on the host.
  void block(const Stream& stream) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds between this event and `end`; both must be recorded with timing enabled (CPU: host clock).
  float elapsedMs(const Event& end) const;

 private:
  Device device_;
  void* event_ = nullptr;
  std::atomic<int64_t> hostTimeNs_{0};  // steady clock at the last record(), for CPU timing
};

// Makes later work on `waiter` wait for the work enqueued on `producer` so far (an event recorded on one,
// blocking the other). Both streams are on `device`'s side; on the CPU this does nothing that waits.
void streamWaits(const Stream& waiter, const Stream& producer, Device device);

struct DeviceStreams {
  // `comm` carries collectives and `gather` all-gathers (NOTE [Collective lanes] in
  // distributed/Communicator.h).
  Stream compute, h2d, d2h, comm, gather;
  // Five new streams on `device` (on the CPU, `compute` is the default CPU stream).
  static DeviceStreams create(Device device);
};

// The five streams of `device`, made on first use and alive for the process. The compute stream is the one
// kernels launch on unless a StreamGuard says otherwise. CPU: the default CPU stream and four CPU streams.
const DeviceStreams& deviceStreams(Device device);

// The stream kernels launch on for `device`. Defaults to deviceStreams(device).compute; StreamGuard changes
// it for the calling thread.
Stream currentStream(Device device);

class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int key_;
  Stream previous_;
  bool hadPrevious_;
};

// Waits for all work on every stream of `device`.
void synchronizeDevice(Device device);

// Median milliseconds of `fn` over `repeats` runs timed with events on `device`'s current stream, after
// `warmup` untimed ones (the benches' and the calibration's timer).
double medianEventMs(Device device, const std::function<void()>& fn, int warmup, int repeats);

}  // namespace strata
