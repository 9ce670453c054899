// The SSD tier of the store: a rank's optimizer state that neither the device nor host memory holds, and the
// parameters homed on the SSD (NOTE [Parameter homes] in zero/ParameterGatherer.h).
//
// NOTE [SSD tier]
// One file per rank under zero_optimization.nvme_path, created at start (its whole size reserved with
// fallocate, so a full disk is found before training) and removed at the end; the tier holds a lock on it,
// and the next run removes a file whose process died without removing it (removeStaleTierFiles). Each chunk
// placed here has an extent of three 4 KiB-aligned fields, each with its own length and stored dtype
// (NvmeTier::ChunkFields), which the optimizer decides: AdamW's fp32 master, then m and v of the master's
// length in store.nvme_state_dtype (fp32, bf16 or fp16; the master stays fp32, as rounding it would lose the
// updates smaller than its last bit), or in bf16 where AdamW keeps them in bf16 in memory
// (optimizer.moments_dtype, moved as they are); Adafactor's (optim/Adafactor.h) fp32 master, its first moment
// (none, or of the master's length) and its second moment's flat buffer, of its own length and always fp32. A
// field's values in memory are fp32, or already in the stored dtype (Adafactor's bf16 first moment), which
// then moves as it is. A chunk whose parameters are homed on the SSD has a fourth field, after the three:
// its 16-bit (or fp32) parameters (this rank's shard at ZeRO-3), stored in their own dtype and moved as they
// are; a chunk may have it with or without optimizer state here, and keeps it when its state leaves. The file
// is opened with O_DIRECT, so the page cache neither doubles the host memory nor hides the disk's speed (file
// systems without O_DIRECT, like some tmpfs, fall back to buffered I/O, said once in the log).
//
// I/O. A field moves in pieces of zero_optimization.aio.block_size bytes (default 16 MiB, rounded down to
// 4 KiB), up to zero_optimization.aio.queue_depth pieces (default 8) in flight, each through a 4 KiB-aligned
// staging buffer where it is converted between fp32 and the stored dtype. Two backends move them: io_uring
// (liburing, where the build found it: STRATA_HAVE_LIBURING) with one ring of queue_depth entries, and a
// pool of queue_depth threads (at most 64) doing pread/pwrite. STRATA_NVME_BACKEND=uring|threads picks
// one (default io_uring where built; a kernel that refuses io_uring falls back to the threads, said in the
// log); the log names the backend once. Staging: at most queue_depth buffers of one piece (one block, or
// the largest field when that is smaller), made on first use.
//
// Order. Every transfer, synchronous or not, runs on the tier's one I/O thread in the order it was issued,
// so a read of a field sees every write of it issued before; a synchronous read or write is an asynchronous
// one waited on at once. The asynchronous calls are what the optimizers' read-ahead and write-behind use
// (optim/SsdStateStream.h, which AdamW and Adafactor share): while the CPU (or, for Adafactor, the device)
// updates the k-th SSD chunk of the step, in its buffer set,
// the I/O thread writes back chunk k-1 and then reads chunk k+1 into the other set (the one chunk k-1's
// write came from, which the order makes safe). The read-ahead stays inside a step (its first read starts
// before the device's update): between steps no buffer holds state, so checkpoints, the memory tracer's
// moves and loads see the file alone. Memory: two sets of buffers of the largest SSD chunk range's fields;
// AdamW's are three fp32 buffers, 2 x 3 x 4 = 24 bytes per element of it (16 with bf16 m and v; a 64 MB
// bf16 chunk whole on one rank: 32 Mi elements, 768 MiB; the one set before was 384 MiB), Adafactor's the
// master's 4 bytes and its first moment's 0, 2 or 4 (its second moment is rows plus columns), plus the
// staging (by default at most 8 x 16 MiB = 128 MiB). The thread pool converts on its threads; io_uring
// converts on the I/O thread as pieces complete.
//
// Errors. A failed read or write (ENOSPC, EIO, a short file) is an error that names the operation, the
// bytes, the offset and the file; it is thrown by the wait for that transfer or any later one, and every
// transfer issued after it fails with it too, so training stops. The state of other tiers and the
// checkpoints are untouched by it. Each piece's stored bytes carry a CRC32C, kept in memory when the piece
// is written and checked when it is read back (on the thread that decodes it, at several GB/s, beside a
// disk's one or two): a file changed underneath the run (a bad disk, another process) is an error that names
// the file and the offset, as a failed read is, before a changed value reaches the optimizer.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/DType.h"

namespace strata::zero {

namespace detail {
class IoBackend;
struct IoPiece;
struct PieceChecksum;
}  // namespace detail

enum class NvmeBackend { Auto, Uring, Threads };

// How the tier moves its bytes (NOTE [SSD tier]).
struct NvmeIoConfig {
  int64_t blockBytes = int64_t(16) << 20;   // zero_optimization.aio.block_size
  int64_t queueDepth = 8;                   // zero_optimization.aio.queue_depth
  NvmeBackend backend = NvmeBackend::Auto;  // Auto: STRATA_NVME_BACKEND, else io_uring where built
};

// Removes the SSD tier's files under `directory` that no live process owns (a run killed before its clean-up
// leaves its file, named by its host and PID, behind) and returns their bytes. A file is stale when it was
// made on this host, its PID is not a live process, and no process holds the lock every live tier keeps on
// its file. Other hosts' files (a shared directory) are left alone. Without this, every killed run would
// shrink the next run's automatic SSD budget by its whole file.
uint64_t removeStaleTierFiles(const std::string& directory);

class NvmeTier {
 public:
  // Fields of a chunk's extent: the optimizer state's three (kStateFields), then the parameters homed here.
  enum Field { Master = 0, FirstMoment = 1, SecondMoment = 2, Parameters = 3 };
  static constexpr int kStateFields = 3;
  static constexpr int kFields = 4;
  // A chunk's extent: each field's elements and stored dtype (fp32, bf16 or fp16). A chunk whose master has
  // no elements has no optimizer state on the SSD; another field of none takes no room.
  struct ChunkFields {
    std::array<int64_t, kFields> elems{};
    std::array<DType, kFields> dtypes{DType::F32, DType::F32, DType::F32};
    // AdamW's: an fp32 master and m, v of `elems` each in `stateDType` (0 elements: not on the SSD).
    static ChunkFields uniform(int64_t elems, DType stateDType) {
      return {{elems, elems, elems}, {DType::F32, stateDType, stateDType}};
    }
    // The parameters homed on the SSD: `elems` in `dtype`, stored as they are.
    ChunkFields& withParameters(int64_t n, DType dtype) {
      elems[Parameters] = n;
      dtypes[Parameters] = dtype;
      return *this;
    }
    // The fields' payload bytes.
    uint64_t bytes() const {
      uint64_t total = 0;
      for (int f = 0; f < kFields; ++f) total += uint64_t(elems[size_t(f)]) * dtypeSize(dtypes[size_t(f)]);
      return total;
    }
  };

  // A file for `rank` under `directory` with an extent per entry of `chunks`. `stateDType` is
  // store.nvme_state_dtype, as the optimizer applied it to the fields.
  NvmeTier(const std::string& directory, int rank, DType stateDType, const std::vector<ChunkFields>& chunks,
           const NvmeIoConfig& io = {});
  // AdamW's layout: an extent per entry of `elems` (elements per chunk; 0: the chunk is not on the SSD),
  // m and v stored in `stateDType`.
  NvmeTier(const std::string& directory, int rank, const std::vector<int64_t>& elems, DType stateDType,
           const NvmeIoConfig& io = {});
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Reads field `f` of chunk `chunk` into `dst` (its elements as fp32 values), converting from the stored
  // dtype.
  void read(size_t chunk, Field f, float* dst);
  // Writes `src` (the field's elements as fp32 values) as field `f` of chunk `chunk`.
  void write(size_t chunk, Field f, const float* src);

  // Asynchronous transfers of fields of one chunk, in issue order (NOTE [SSD tier]). Each field's values
  // (its elements, fp32 or in the field's stored dtype as `dtype` says) must stay untouched until the
  // ticket was waited on.
  struct FieldValues {
    Field field;
    void* values;
    DType dtype = DType::F32;
  };
  using Ticket = uint64_t;
  Ticket readAsync(size_t chunk, const std::vector<FieldValues>& fields);
  Ticket writeAsync(size_t chunk, const std::vector<FieldValues>& fields);
  // Waits for `ticket` and every transfer issued before it; throws the first failure among them.
  void wait(Ticket ticket);
  // Waits for every transfer issued so far, throwing nothing (a failure stays for the next wait): what an
  // owner of buffers in flight calls before it frees them on an error path.
  void drain() noexcept;
  // The backend moving the bytes: "io_uring" or "threads".
  const char* backendName() const;
  // Whether this build has the io_uring backend.
  static bool uringBuilt();

  // Chunk `chunk`'s optimizer state left the SSD (moved to the device): its state fields are no longer
  // state. Its parameters, where homed here, stay.
  void release(size_t chunk);
  // Whether chunk `chunk`'s optimizer state is on the SSD, whether its parameters are, and the elements and
  // stored dtype of its field `f`.
  bool holds(size_t chunk) const { return chunk < chunks_.size() && chunks_[chunk].elems[Master] > 0; }
  bool holdsParameters(size_t chunk) const {
    return chunk < chunks_.size() && chunks_[chunk].elems[Parameters] > 0;
  }
  int64_t fieldElems(size_t chunk, Field f) const { return chunks_.at(chunk).elems[f]; }
  DType fieldDType(size_t chunk, Field f) const { return chunks_.at(chunk).dtypes[f]; }
  // Bytes of optimizer state chunk `chunk`'s fields hold (without the alignment padding; 0 off the SSD).
  uint64_t chunkStateBytes(size_t chunk) const;
  const std::string& path() const { return path_; }
  uint64_t fileBytes() const { return fileBytes_; }
  // Bytes of optimizer state this tier holds (the fields' payload, without the alignment padding), and of
  // parameters.
  uint64_t stateBytes() const { return stateBytes_; }
  uint64_t parameterBytes() const { return parameterBytes_; }
  DType stateDType() const { return stateDType_; }
  // Bytes moved since construction, for the log's bandwidth figures.
  uint64_t bytesRead() const { return bytesRead_; }
  uint64_t bytesWritten() const { return bytesWritten_; }

 private:
  uint64_t offsetOf(size_t chunk, Field f) const;
  size_t fieldBytes(size_t chunk, Field f) const;
  // Queues the pieces of `fields` of `chunk` for the I/O thread.
  Ticket submit(bool write, size_t chunk, const std::vector<FieldValues>& fields);
  void ioLoop();

  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  DType stateDType_;
  std::vector<ChunkFields> chunks_;
  std::vector<std::array<uint64_t, kFields>> offsets_;  // per chunk and field: its first byte
  uint64_t fileBytes_ = 0, stateBytes_ = 0, parameterBytes_ = 0;
  std::atomic<uint64_t> bytesRead_{0}, bytesWritten_{0};
  size_t blockBytes_ = 0;  // a piece's most bytes: aio.block_size rounded down to 4 KiB
  std::unique_ptr<detail::IoBackend> backend_;
  // Per chunk and field, each piece's checksum as last written (touched by the transfer moving the piece).
  std::vector<std::array<std::vector<detail::PieceChecksum>, kFields>> checksums_;
  // The I/O thread's queue: jobs run in ticket order; `done_` is the last ticket that ended, `failedAt_`
  // the first that failed (0: none) and `failure_` its error.
  struct Job {
    Ticket ticket;
    bool write;
    std::vector<detail::IoPiece> pieces;
  };
  std::mutex mutex_;
  std::condition_variable queued_, ended_;
  std::deque<Job> jobs_;
  Ticket issued_ = 0, done_ = 0, failedAt_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread ioThread_;
};

}  // namespace strata::zero
