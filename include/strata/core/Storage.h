// Storage: the bytes behind one or more tensors.
//
// NOTE [Re-pointable storage]
// A parameter is a view into a chunk, and a chunk's bytes move between an arena slot on the GPU, a host
// buffer and "not resident". The chunk manager moves them by calling `repoint()` / `evict()` on the
// StorageImpl that every view shares, so modules never notice. Nothing may cache `data()` across calls:
// re-read it each time. Touching a storage that is not resident throws, naming the storage's label.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/core/Allocator.h"
#include "strata/core/Device.h"

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

  // Points this storage at `data` on `device` (not owned). Releases owned memory first.
  void repoint(void* data, Device device);
  // Marks the bytes as not resident. Releases owned memory.
  void evict();

  // Bumped by every op that writes into existing tensors over this storage (ops::fill, ops::copy,
  // ops::matmulAccumulate, ops::adamw) and by repoint/evict, so a cached copy of the contents (a parameter's
  // bf16 copy for the GEMMs) can tell it is stale. Writes through a raw data() pointer do not bump it.
  uint64_t version() const { return version_; }
  void bumpVersion() { ++version_; }

  void setLabel(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

 private:
  void releaseOwned();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* owner_ = nullptr;  // set when data_ came from an allocator
  uint64_t version_ = 0;
  std::string label_;
};

using Storage = std::shared_ptr<StorageImpl>;

Storage makeStorage(size_t bytes, Device device);

// Copies raw bytes between any two devices, ordered on the current stream of the GPU involved; returns once
// the bytes have landed.
void copyBytes(void* dst, Device dstDevice, const void* src, Device srcDevice, size_t bytes);

}  // namespace strata
