#include "NvmeIo.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#if STRATA_HAVE_LIBURING
#include <liburing.h>
#endif

#include "strata/core/Checksum.h"
#include "strata/core/Error.h"
#include "strata/core/FileError.h"
#include "strata/core/Half.h"

namespace strata::zero::detail {

namespace {

constexpr size_t kAlign = 4096;

// A 4 KiB-aligned staging buffer, made on first use.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  ~AlignedBuffer() { std::free(data_); }
  void* get(size_t bytes) {
    if (data_ == nullptr)
      STRATA_CHECK(::posix_memalign(&data_, kAlign, bytes) == 0,
                   "cannot allocate the SSD tier's {}-byte buffer", bytes);
    return data_;
  }

 private:
  void* data_ = nullptr;
};

// One piece through one buffer with pread/pwrite, resumed after a short transfer or a signal.
void transferPiece(int fd, const std::string& path, bool write, const IoPiece& piece, void* buffer) {
  if (write) encodePiece(piece, buffer);
  char* p = static_cast<char*>(buffer);
  size_t done = 0;
  while (done < piece.bytes) {
    ssize_t n = write ? ::pwrite(fd, p + done, piece.bytes - done, off_t(piece.offset + done))
                      : ::pread(fd, p + done, piece.bytes - done, off_t(piece.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ioFailed(path, write, piece.bytes - done, piece.offset + done, n < 0 ? errno : 0);
    done += size_t(n);
  }
  if (!write) decodePiece(piece, buffer, path);
}

// A pool of `depth` threads, each with its own buffer, taking the pieces of one run() at a time.
class ThreadsBackend final : public IoBackend {
 public:
  ThreadsBackend(int fd, const std::string& path, int depth, size_t pieceBytes)
      : fd_(fd), path_(path), pieceBytes_(pieceBytes) {
    for (int k = 0; k < depth; ++k) workers_.emplace_back([this] { work(); });
  }
  ~ThreadsBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& t : workers_) t.join();
  }
  const char* name() const override { return "threads"; }

  void run(bool write, const std::vector<IoPiece>& pieces) override {
    if (pieces.empty()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    pieces_ = &pieces;
    write_ = write;
    next_ = 0;
    remaining_ = pieces.size();
    failure_ = nullptr;
    ready_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    pieces_ = nullptr;
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

 private:
  void work() {
    AlignedBuffer buffer;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return stop_ || (pieces_ != nullptr && next_ < pieces_->size()); });
      if (stop_) return;
      const IoPiece& piece = (*pieces_)[next_++];
      bool write = write_, skip = failure_ != nullptr;
      lock.unlock();
      std::exception_ptr failure;
      if (!skip) {
        try {
          transferPiece(fd_, path_, write, piece, buffer.get(pieceBytes_));
        } catch (...) {
          failure = std::current_exception();
        }
      }
      lock.lock();
      if (failure && !failure_) failure_ = failure;
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  int fd_;
  std::string path_;
  size_t pieceBytes_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable ready_, done_;
  const std::vector<IoPiece>* pieces_ = nullptr;  // the current run's, while one runs
  bool write_ = false, stop_ = false;
  size_t next_ = 0, remaining_ = 0;
  std::exception_ptr failure_;
};

#if STRATA_HAVE_LIBURING

// One ring of `depth` entries; each transfer in flight owns a slot (a buffer and how far it got). Completions
// are reaped by the calling thread, which also converts the pieces.
class UringBackend final : public IoBackend {
 public:
  UringBackend(int fd, const std::string& path, int depth, size_t pieceBytes)
      : fd_(fd), path_(path), pieceBytes_(pieceBytes), slots_(size_t(depth)) {
    initError_ = -io_uring_queue_init(unsigned(depth), &ring_, 0);
  }
  ~UringBackend() override {
    if (initError_ == 0) io_uring_queue_exit(&ring_);
  }
  // 0, or the errno with which the kernel refused the ring.
  int initError() const { return initError_; }
  const char* name() const override { return "io_uring"; }

  void run(bool write, const std::vector<IoPiece>& pieces) override {
    STRATA_CHECK(!broken_, "the SSD tier's io_uring ring failed earlier");
    std::vector<size_t> idle;
    for (size_t s = slots_.size(); s-- > 0;) idle.push_back(s);
    size_t next = 0, queued = 0, inKernel = 0;
    // The first failure: its errno (0: end of file), bytes and offset.
    bool failed = false;
    std::exception_ptr corrupt;  // a piece read back that fails its checksum
    int failError = 0;
    size_t failBytes = 0, lastPrepared = 0;
    uint64_t failOffset = 0;
    auto prepare = [&](size_t s) {
      lastPrepared = s;
      Slot& slot = slots_[s];
      const IoPiece& p = pieces[slot.piece];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      STRATA_CHECK(sqe != nullptr, "the SSD tier's io_uring ring is full");
      char* at = static_cast<char*>(slot.buffer.get(pieceBytes_)) + slot.done;
      if (write)
        io_uring_prep_write(sqe, fd_, at, unsigned(p.bytes - slot.done), p.offset + slot.done);
      else
        io_uring_prep_read(sqe, fd_, at, unsigned(p.bytes - slot.done), p.offset + slot.done);
      io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(uintptr_t(s)));
      ++queued;
    };
    for (;;) {
      while (!failed && !corrupt && next < pieces.size() && !idle.empty()) {
        size_t s = idle.back();
        idle.pop_back();
        slots_[s].piece = next++;
        slots_[s].done = 0;
        if (write) encodePiece(pieces[slots_[s].piece], slots_[s].buffer.get(pieceBytes_));
        prepare(s);
      }
      if (queued > 0) {
        int r = io_uring_submit(&ring_);
        if (r >= 0) {
          queued -= size_t(r);
          inKernel += size_t(r);
        } else if (r != -EINTR && r != -EAGAIN && r != -EBUSY) {
          // Entries left unsubmitted in the ring cannot be taken back: the ring is not used again.
          broken_ = true;
          if (!failed) {
            failed = true;
            failError = -r;
            failBytes = pieces[slots_[lastPrepared].piece].bytes - slots_[lastPrepared].done;
            failOffset = pieces[slots_[lastPrepared].piece].offset + slots_[lastPrepared].done;
          }
          queued = 0;
        }
      }
      if (inKernel == 0) {
        if (queued == 0) break;
        continue;  // the kernel was busy: submit again
      }
      io_uring_cqe* cqe = nullptr;
      int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      STRATA_CHECK(r == 0, "waiting for the SSD tier's io_uring completions failed: {}", std::strerror(-r));
      size_t s = size_t(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --inKernel;
      Slot& slot = slots_[s];
      const IoPiece& p = pieces[slot.piece];
      if (res == -EINTR || res == -EAGAIN) {
        prepare(s);
        continue;
      }
      if (res <= 0) {
        if (!failed) {
          failed = true;
          failError = -res;
          failBytes = p.bytes - slot.done;
          failOffset = p.offset + slot.done;
        }
        idle.push_back(s);
        continue;
      }
      slot.done += size_t(res);
      if (slot.done < p.bytes) {
        prepare(s);  // a short transfer: the rest
        continue;
      }
      if (!write && !failed && !corrupt) {
        try {
          decodePiece(p, slot.buffer.get(pieceBytes_), path_);
        } catch (...) {
          corrupt = std::current_exception();  // thrown once nothing is in flight
        }
      }
      idle.push_back(s);
    }
    if (failed) ioFailed(path_, write, failBytes, failOffset, failError);
    if (corrupt) std::rethrow_exception(corrupt);
  }

 private:
  struct Slot {
    AlignedBuffer buffer;
    size_t piece = 0, done = 0;
  };
  int fd_;
  std::string path_;
  size_t pieceBytes_;
  io_uring ring_{};
  int initError_ = 0;
  std::vector<Slot> slots_;
  bool broken_ = false;
};

#endif

}  // namespace

void encodePiece(const IoPiece& piece, void* buffer) {
  const float* src = static_cast<const float*>(piece.values);
  size_t n = piece.count;
  if (piece.memory == piece.dtype) {
    std::memcpy(buffer, piece.values, n * dtypeSize(piece.dtype));
  } else if (piece.dtype == DType::BF16) {
    BFloat16* d = static_cast<BFloat16*>(buffer);
    for (size_t i = 0; i < n; ++i) d[i] = BFloat16(src[i]);
  } else {
    Half* d = static_cast<Half*>(buffer);
    for (size_t i = 0; i < n; ++i) d[i] = Half(src[i]);
  }
  size_t payload = n * dtypeSize(piece.dtype);
  std::memset(static_cast<char*>(buffer) + payload, 0, piece.bytes - payload);
  if (piece.checksum != nullptr) *piece.checksum = PieceChecksum{crc32c(buffer, payload), true};
}

void decodePiece(const IoPiece& piece, const void* buffer, const std::string& path) {
  float* dst = static_cast<float*>(piece.values);
  size_t n = piece.count;
  if (piece.checksum != nullptr && piece.checksum->written) {
    uint32_t crc = crc32c(buffer, n * dtypeSize(piece.dtype));
    auto hex = [](uint32_t v) {
      char text[9];
      std::snprintf(text, sizeof(text), "%08x", v);
      return std::string(text);
    };
    STRATA_USER_CHECK(
        crc == piece.checksum->crc,
        "the SSD tier's file {} is corrupted: the {} bytes at offset {} read back with CRC32C {}, "
        "written with {} (the disk, or another process, changed them); the state there is lost: "
        "resume from the last checkpoint",
        path, n * dtypeSize(piece.dtype), piece.offset, hex(crc), hex(piece.checksum->crc));
  }
  if (piece.memory == piece.dtype) {
    std::memcpy(piece.values, buffer, n * dtypeSize(piece.dtype));
  } else if (piece.dtype == DType::BF16) {
    const BFloat16* s = static_cast<const BFloat16*>(buffer);
    for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
  } else {
    const Half* s = static_cast<const Half*>(buffer);
    for (size_t i = 0; i < n; ++i) dst[i] = float(s[i]);
  }
}

void ioFailed(const std::string& path, bool write, size_t bytes, uint64_t offset, int error) {
  STRATA_USER_FAIL("the SSD tier's {} of {} bytes at offset {} of {} failed: {}", write ? "write" : "read",
                   bytes, offset, path, error != 0 ? fileErrorText(error) : "end of file");
}

std::unique_ptr<IoBackend> makeThreadsBackend(int fd, const std::string& path, int depth, size_t pieceBytes) {
  return std::make_unique<ThreadsBackend>(fd, path, depth, pieceBytes);
}

std::unique_ptr<IoBackend> makeUringBackend(int fd, const std::string& path, int depth, size_t pieceBytes,
                                            std::string& why) {
#if STRATA_HAVE_LIBURING
  auto backend = std::make_unique<UringBackend>(fd, path, depth, pieceBytes);
  if (backend->initError() != 0) {
    why = std::string("the kernel refuses io_uring: ") + std::strerror(backend->initError());
    return nullptr;
  }
  return backend;
#else
  (void)fd, (void)path, (void)depth, (void)pieceBytes;
  why = "this build has no liburing";
  return nullptr;
#endif
}

}  // namespace strata::zero::detail
