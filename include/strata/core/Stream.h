// Streams and events. Each device has four streams (compute, H2D, D2H, comm) ordered with events. On the CPU
// the same API runs synchronously: work is done when the call returns, events are always complete. This lets
// the overlap logic of the store and the optimizer run, unchanged, in CPU tests.
#pragma once

#include <chrono>
#include <memory>

#include "strata/core/Device.h"

namespace strata {

class Stream {
 public:
  Stream() = default;  // the CPU stream
  // A new stream on `device` (a non-blocking CUDA stream; nothing on the CPU).
  static Stream create(Device device);
  Device device() const { return device_; }
  // cudaStream_t of a CUDA stream, nullptr on the CPU.
  void* native() const { return handle_ ? handle_->stream : nullptr; }
  void synchronize() const;
  bool operator==(const Stream& o) const { return device_ == o.device_ && native() == o.native(); }

 private:
  struct Handle {
    void* stream = nullptr;
    int deviceIndex = 0;
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

  void record(const Stream& stream);
  // Makes later work on `stream` wait until this event completes (no host blocking).
  void block(const Stream& stream) const;
  void synchronize() const;
  bool query() const;
  // Milliseconds between this event and `end`; both must be recorded with timing enabled (CPU: host clock).
  float elapsedMs(const Event& end) const;

 private:
  Device device_;
  void* event_ = nullptr;
  std::chrono::steady_clock::time_point hostTime_{};
};

struct DeviceStreams {
  Stream compute, h2d, d2h, comm;
  static DeviceStreams create(Device device);
};

// The stream kernels launch on for `device`. Defaults to the device's compute stream; StreamGuard changes it
// for the calling thread.
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

}  // namespace strata
