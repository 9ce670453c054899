// Storage: the bytes behind one or more tensors.
//
// NOTE [Re-pointable storage]
// A parameter is a view into a chunk, and a chunk's bytes move between an arena slot on the GPU, a host
// buffer and "not resident". The chunk manager moves them by calling `repoint()` / `evict()` on the
// StorageImpl that every view shares, so modules never notice. Nothing may cache `data()` across calls:
// re-read it each time. Touching a storage that is not resident throws, naming the storage's label, or as
// the owner that evicted it explains (setNotResidentMessage: ZeRO-3's gatherer names the parameter touched
// and how to use it while it is resident).
//
// NOTE [Content version and residency]
// A storage counts two things apart. `version()` is its content version: ops that write into it bump it, and
// autograd (a weight saved for the backward) compares it to tell a write from no write. `residencyVersion()`
// counts moves: repoint() and evict() bump it and leave the content version alone, because moving bytes is
// not writing them. So a weight evicted after the forward and re-pointed at the same values before the
// backward passes the backward's check, while an ops::copy into it in between still fails it. A caller that
// re-points a storage at *different* values (loading other weights into place) writes it, and must say so
// with bumpVersion().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/core/Allocator.h"
#include "strata/core/Device.h"
#include "strata/core/Stream.h"

namespace strata {

class StorageImpl {
 public:
  // Owning storage from an allocator.
  StorageImpl(size_t bytes, Allocator& allocator);
  // Non-owning storage over memory someone else manages (an arena slot, a user buffer).
  StorageImpl(void* data, size_t bytes, Device device);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const;
  void* dataUnchecked() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool resident() const { return data_ != nullptr || bytes_ == 0; }

  // Points this storage at `data` on `device` (not owned), which must hold the same contents (see NOTE
  // [Content version and residency]). Releases owned memory first.
  void repoint(void* data, Device device);
  // Marks the bytes as not resident. Releases owned memory.
  void evict();

  // The content version: bumped by every op that writes into existing tensors over this storage
  // (ops::fill, ops::copy, ops::matmulAccumulate, ops::adamw), so a cached copy of the contents (a
  // parameter's bf16 copy for the GEMMs) or a tensor saved for the backward can tell it was written. Not by
  // repoint/evict. Writes through a raw data() pointer do not bump it.
  uint64_t version() const { return version_; }
  void bumpVersion() { ++version_; }
  // Bumped by repoint and evict only: where the bytes are changed, not what they are.
  uint64_t residencyVersion() const { return residencyVersion_; }

  // Tells the allocator that owns the bytes that `stream` uses them (Allocator::recordStream), so that
  // once this storage is freed the bytes are reused only after the work enqueued on `stream` has completed.
  // Does nothing for bytes this storage does not own (an arena slot, a user buffer): their owner keeps them
  // alive.
  void recordStream(const Stream& stream);

  void setLabel(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

  // The error for touching bytes [begin, end) of this storage while it is not resident, from the owner that
  // evicts it (which knows what lies there and what to do); without one the error names the label.
  using NotResidentMessage = std::function<std::string(size_t begin, size_t end)>;
  void setNotResidentMessage(NotResidentMessage message) { notResidentMessage_ = std::move(message); }
  // Throws that error (data() for the whole storage, Tensor::data() for the bytes its view spans).
  [[noreturn]] void failNotResident(size_t begin, size_t end) const;

 private:
  void releaseOwned();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* owner_ = nullptr;  // set when data_ came from an allocator
  uint64_t version_ = 0;
  uint64_t residencyVersion_ = 0;
  std::string label_;
  NotResidentMessage notResidentMessage_;
};

using Storage = std::shared_ptr<StorageImpl>;

Storage makeStorage(size_t bytes, Device device);

// Copies raw bytes between any two devices, ordered on the current stream of the GPU involved; returns once
// the bytes have landed. Host memory may be pageable.
void copyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes);

// Copies raw bytes host to device, device to host or device to device, ordered on `stream`, without
// blocking the host: it returns once the copy is enqueued. Later work on `stream`, or on a stream that
// blocks on an Event recorded on it after the call, sees the bytes.
// - Host memory must be page-locked (a PinnedHostPool, cudaHostAlloc, cudaHostRegister): pageable memory is
//   refused with an error, because CUDA would quietly make such a copy block the host. Use copyBytes for a
//   synchronous copy from pageable memory.
// - `stream` is on the GPU involved (either GPU for device to device), or, for two host buffers, a CPU
//   stream.
// - On the CPU (two host buffers) this is a memcpy, done when the call returns; host memory may then be
//   pageable.
// - Both buffers must stay allocated and unchanged until the copy has completed: synchronize, wait on an
//   event, or call recordStream(stream) on their allocator (StorageImpl::recordStream) before freeing them.
void copyAsync(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes,
               const Stream& stream);

}  // namespace strata
