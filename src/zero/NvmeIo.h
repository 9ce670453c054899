// The SSD tier's I/O backends (NOTE [SSD tier] in strata/zero/NvmeTier.h): io_uring, and a pread/pwrite
// thread pool where liburing is absent or the kernel refuses io_uring. Both move a list of pieces with up to
// a queue depth of them in flight, through 4 KiB-aligned staging buffers of their own, and convert between
// the stored dtype and fp32 on the way (the same conversion for both, so both store the same bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/DType.h"

namespace strata::zero::detail {

// The CRC32C of a piece's payload as it was last written (NOTE [SSD tier] in strata/zero/NvmeTier.h).
struct PieceChecksum {
  uint32_t crc = 0;
  bool written = false;
};

// One transfer between `count` values in memory (fp32, or already in `dtype`: `memory`) and the file:
// `bytes` (a 4 KiB multiple: the payload in `dtype`, then zeros) at `offset`. `checksum`: the piece's.
struct IoPiece {
  uint64_t offset = 0;
  size_t bytes = 0;
  size_t count = 0;
  DType dtype = DType::F32;
  void* values = nullptr;
  DType memory = DType::F32;
  PieceChecksum* checksum = nullptr;
};

// The stored bytes of a piece from its values (zeros after the payload), recording the payload's checksum;
// and its values from stored bytes, after checking that checksum (a mismatch is an error naming `path`).
void encodePiece(const IoPiece& piece, void* buffer);
void decodePiece(const IoPiece& piece, const void* buffer, const std::string& path);

// A failed transfer, as the user sees it: the operation, the bytes, the offset and the file. `error` is an
// errno value, or 0 for a read that met the end of the file.
[[noreturn]] void ioFailed(const std::string& path, bool write, size_t bytes, uint64_t offset, int error);

class IoBackend {
 public:
  virtual ~IoBackend() = default;
  virtual const char* name() const = 0;
  // Writes every piece (each encoded into a staging buffer first) or reads it (decoded after), up to the
  // queue depth in flight, in any order. Returns when all have ended; once one fails no new one starts, and
  // the first failure is thrown when none is in flight any more.
  virtual void run(bool write, const std::vector<IoPiece>& pieces) = 0;
};

// `depth` transfers in flight, each through a buffer of `pieceBytes` (a 4 KiB multiple: the largest piece).
std::unique_ptr<IoBackend> makeThreadsBackend(int fd, const std::string& path, int depth, size_t pieceBytes);
// Null where liburing was not built in or the kernel refuses a ring; `why` then says which.
std::unique_ptr<IoBackend> makeUringBackend(int fd, const std::string& path, int depth, size_t pieceBytes,
                                            std::string& why);

}  // namespace strata::zero::detail
