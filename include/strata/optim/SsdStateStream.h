// How an optimizer's update passes over its SSD-resident chunks (NOTE [SSD tier] in zero/NvmeTier.h): each
// chunk's fields are read ahead into one of two buffer sets that take turns and written back behind the
// update, in the order the update uses them. AdamW (optim/AdamW.h) and Adafactor (optim/Adafactor.h) both
// drive their SSD chunks through it; what they do with a chunk's state between acquire and release is
// theirs.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/zero/NvmeTier.h"

namespace strata::optim {

// A chunk's state off the device: its fp32 master, its first moment (undefined where there is none) and its
// second moment, each flat.
struct StateTensors {
  Tensor master, m, v;
};

// The buffer sets SSD-resident state passes through, kept between updates: made on first use and grown to
// the largest chunk they were asked to hold.
class SsdBuffers {
 public:
  // `dtypes`: each field's dtype in memory (NvmeTier::Field order): fp32, or the field's stored dtype, which
  // then moves as it is. `pinned`: page-locked host memory, for state the device copies in and out.
  explicit SsdBuffers(std::array<DType, zero::NvmeTier::kStateFields> dtypes = {DType::F32, DType::F32,
                                                                                DType::F32},
                      bool pinned = false)
      : dtypes_(dtypes), pinned_(pinned) {}
  // Set `set`'s buffers for chunk `c` of `tier` (each field's first elements; undefined for a field of
  // none), each made (or remade) to hold at least max(its elements, `least`[field]).
  StateTensors get(size_t set, const zero::NvmeTier& tier, size_t c,
                   const std::array<int64_t, zero::NvmeTier::kStateFields>& least = {});
  // Chunk c's state read into the first set now (outside an update: nothing may be in flight).
  StateTensors readNow(zero::NvmeTier& tier, size_t c);
  // The tier's transfers of `state`'s defined fields.
  static std::vector<zero::NvmeTier::FieldValues> fields(const StateTensors& state);

 private:
  std::array<DType, zero::NvmeTier::kStateFields> dtypes_;
  bool pinned_;
  Tensor buffers_[2][zero::NvmeTier::kStateFields];
};

// One update's pass over the SSD chunks `order` (in use order): chunk order[k] is read into set k % 2 (k %
// 1 without read-ahead), acquire(k) waits for it and asks for the next one into the other set, release(k)
// writes it back behind. The tier runs its transfers in issue order, so a read into a set starts after the
// write from it ended. Leaving by an exception waits for whatever is still in flight before the buffers can
// go.
class SsdStateStream {
 public:
  SsdStateStream(zero::NvmeTier* tier, SsdBuffers& buffers, std::vector<size_t> order, bool readAhead = true);
  ~SsdStateStream();
  SsdStateStream(const SsdStateStream&) = delete;
  SsdStateStream& operator=(const SsdStateStream&) = delete;

  size_t size() const { return order_.size(); }
  size_t chunk(size_t k) const { return order_[k]; }
  // Issues the reads that need no set to come free (the first one): before the work the reads hide.
  void start();
  // The k-th chunk's state, once read (k in order, each once).
  StateTensors acquire(size_t k);
  // Writes the k-th chunk's state back behind.
  void release(size_t k, const StateTensors& state);
  // Waits for the last write.
  void finish();
  // Seconds acquire and finish waited for the tier (what read-ahead did not hide).
  double waitSeconds() const { return waitSeconds_; }

 private:
  void readUpTo(size_t upTo);
  zero::NvmeTier* tier_;
  SsdBuffers& buffers_;
  std::vector<size_t> order_;
  size_t sets_;
  std::array<int64_t, zero::NvmeTier::kStateFields> largest_{};
  std::vector<zero::NvmeTier::Ticket> reads_;
  size_t readsIssued_ = 0;
  zero::NvmeTier::Ticket written_ = 0;
  int uncaught_;
  double waitSeconds_ = 0;
};

}  // namespace strata::optim
