// The SSD tier of the store: a rank's optimizer state that neither the device nor host memory holds.
//
// NOTE [SSD tier]
// One file per rank under zero_optimization.nvme_path, created at start (its whole size reserved with
// fallocate, so a full disk is found before training) and removed at the end. Each chunk placed here has an
// extent of 4 KiB-aligned fields: its fp32 master, then m and v in store.nvme_state_dtype (fp32, bf16 or
// fp16; the master stays fp32, as rounding it would lose the updates smaller than its last bit). The file is
// opened with O_DIRECT and moved in 16 MiB pieces through 4 KiB-aligned buffers, so the page cache neither
// doubles the host memory nor hides the disk's speed (file systems without O_DIRECT, like some tmpfs, fall
// back to buffered I/O, said once in the log). A failed read or write (ENOSPC, EIO) is an error that names
// the file and the operation; the state of other tiers and the checkpoints are untouched by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/DType.h"

namespace strata::zero {

class NvmeTier {
 public:
  // A file for `rank` under `directory` with an extent per entry of `elems` (elements per chunk; 0: the
  // chunk is not on the SSD). `stateDType` is how m and v are stored.
  NvmeTier(const std::string& directory, int rank, const std::vector<int64_t>& elems, DType stateDType);
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Fields of a chunk's extent.
  enum Field { Master = 0, FirstMoment = 1, SecondMoment = 2 };
  // Reads field `f` of chunk `chunk` into `dst` (elems fp32 values), converting from the stored dtype.
  void read(size_t chunk, Field f, float* dst);
  // Writes `src` (elems fp32 values) as field `f` of chunk `chunk`.
  void write(size_t chunk, Field f, const float* src);

  // Chunk `chunk` left the SSD (moved to the device): its extent is no longer state.
  void release(size_t chunk);
  const std::string& path() const { return path_; }
  uint64_t fileBytes() const { return fileBytes_; }
  // Bytes of state this tier holds (the fields' payload, without the alignment padding).
  uint64_t stateBytes() const { return stateBytes_; }
  DType stateDType() const { return stateDType_; }
  // Bytes moved since construction, for the log's bandwidth figures.
  uint64_t bytesRead() const { return bytesRead_; }
  uint64_t bytesWritten() const { return bytesWritten_; }

 private:
  uint64_t offsetOf(size_t chunk, Field f) const;
  size_t fieldBytes(size_t chunk, Field f) const;
  void transfer(bool write, uint64_t offset, size_t bytes);
  // Calls body(first element, count, stored dtype, file offset, aligned bytes) per 16 MiB piece of a field.
  template <class Body>
  void forEachPiece(size_t chunk, Field f, Body&& body);

  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  DType stateDType_;
  std::vector<int64_t> elems_;
  std::vector<uint64_t> offsets_;  // per chunk: the extent's first byte
  uint64_t fileBytes_ = 0, stateBytes_ = 0;
  uint64_t bytesRead_ = 0, bytesWritten_ = 0;
  void* buffer_ = nullptr;  // 4 KiB-aligned I/O buffer of kPieceBytes
};

}  // namespace strata::zero
