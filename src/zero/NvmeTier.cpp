#include "strata/zero/NvmeTier.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "strata/core/Error.h"
#include "strata/core/Half.h"

namespace strata::zero {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kAlign = 4096;
constexpr size_t kPieceBytes = size_t(16) << 20;

uint64_t alignUp(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

NvmeTier::NvmeTier(const std::string& directory, int rank, const std::vector<int64_t>& elems,
                   DType stateDType)
    : stateDType_(stateDType), elems_(elems) {
  STRATA_USER_CHECK(stateDType == DType::F32 || stateDType == DType::BF16 || stateDType == DType::F16,
                    "store.nvme_state_dtype must be fp32, bf16 or fp16");
  STRATA_USER_CHECK(
      !directory.empty(),
      "the SSD tier needs a directory: set zero_optimization.nvme_path (e.g. a folder on the SSD)");
  std::error_code ec;
  fs::create_directories(directory, ec);
  STRATA_USER_CHECK(fs::is_directory(directory), "zero_optimization.nvme_path {} is not a directory{}",
                    directory, ec ? ": " + ec.message() : std::string());
  for (size_t c = 0; c < elems_.size(); ++c) {
    offsets_.push_back(fileBytes_);
    if (elems_[c] == 0) continue;
    for (int f = 0; f < 3; ++f) {
      fileBytes_ += alignUp(fieldBytes(c, Field(f)));
      stateBytes_ += fieldBytes(c, Field(f));
    }
  }
  path_ = (fs::path(directory) /
           ("strata-state-rank" + std::to_string(rank) + "-" + std::to_string(::getpid()) + ".bin"))
              .string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0 && errno == EINVAL) {
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    spdlog::warn("{}: the file system refuses O_DIRECT; the SSD tier uses buffered I/O", directory);
  }
  STRATA_USER_CHECK(fd_ >= 0, "cannot create the SSD tier's file {}: {}", path_, std::strerror(errno));
  // Reserve the whole file now: a disk too small fails here, before any training.
  if (fileBytes_ > 0) {
    int err = ::posix_fallocate(fd_, 0, off_t(fileBytes_));
    if (err != 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
      fd_ = -1;
      STRATA_USER_FAIL(
          "cannot reserve {} bytes for the SSD tier in {}: {} (store.nvme_budget_gb, "
          "zero_optimization.nvme_path)",
          fileBytes_, path_, std::strerror(err));
    }
  }
  STRATA_CHECK(::posix_memalign(&buffer_, kAlign, kPieceBytes) == 0, "cannot allocate the SSD tier's buffer");
}

NvmeTier::~NvmeTier() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::free(buffer_);
}

void NvmeTier::release(size_t chunk) {
  if (chunk >= elems_.size() || elems_[chunk] == 0) return;
  for (int f = 0; f < 3; ++f) stateBytes_ -= fieldBytes(chunk, Field(f));
  elems_[chunk] = 0;  // its offsets stay; nothing reads it again
}

size_t NvmeTier::fieldBytes(size_t chunk, Field f) const {
  return size_t(elems_[chunk]) * (f == Master ? 4 : dtypeSize(stateDType_));
}

uint64_t NvmeTier::offsetOf(size_t chunk, Field f) const {
  uint64_t o = offsets_[chunk];
  for (int k = 0; k < int(f); ++k) o += alignUp(fieldBytes(chunk, Field(k)));
  return o;
}

void NvmeTier::transfer(bool write, uint64_t offset, size_t bytes) {
  char* p = static_cast<char*>(buffer_);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = write ? ::pwrite(fd_, p + done, bytes - done, off_t(offset + done))
                      : ::pread(fd_, p + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    STRATA_USER_CHECK(n > 0, "the SSD tier's {} of {} bytes at offset {} of {} failed: {}",
                      write ? "write" : "read", bytes - done, offset + done, path_,
                      n < 0 ? std::strerror(errno) : "end of file");
    done += size_t(n);
  }
  (write ? bytesWritten_ : bytesRead_) += bytes;
}

template <class Body>
void NvmeTier::forEachPiece(size_t chunk, Field f, Body&& body) {
  STRATA_CHECK(chunk < elems_.size() && elems_[chunk] > 0, "chunk {} has no extent on the SSD tier", chunk);
  DType dt = f == Master ? DType::F32 : stateDType_;
  size_t esize = dtypeSize(dt), perPiece = kPieceBytes / esize;
  uint64_t base = offsetOf(chunk, f);
  for (int64_t first = 0; first < elems_[chunk]; first += int64_t(perPiece)) {
    size_t n = size_t(std::min<int64_t>(int64_t(perPiece), elems_[chunk] - first));
    body(size_t(first), n, dt, base + uint64_t(first) * esize, size_t(alignUp(n * esize)));
  }
}

void NvmeTier::read(size_t chunk, Field f, float* dst) {
  forEachPiece(chunk, f, [&](size_t first, size_t n, DType dt, uint64_t offset, size_t bytes) {
    transfer(false, offset, bytes);
    if (dt == DType::F32) {
      std::memcpy(dst + first, buffer_, n * 4);
    } else if (dt == DType::BF16) {
      const BFloat16* s = static_cast<const BFloat16*>(buffer_);
      for (size_t i = 0; i < n; ++i) dst[first + i] = float(s[i]);
    } else {
      const Half* s = static_cast<const Half*>(buffer_);
      for (size_t i = 0; i < n; ++i) dst[first + i] = float(s[i]);
    }
  });
}

void NvmeTier::write(size_t chunk, Field f, const float* src) {
  forEachPiece(chunk, f, [&](size_t first, size_t n, DType dt, uint64_t offset, size_t bytes) {
    if (dt == DType::F32) {
      std::memcpy(buffer_, src + first, n * 4);
    } else if (dt == DType::BF16) {
      BFloat16* d = static_cast<BFloat16*>(buffer_);
      for (size_t i = 0; i < n; ++i) d[i] = BFloat16(src[first + i]);
    } else {
      Half* d = static_cast<Half*>(buffer_);
      for (size_t i = 0; i < n; ++i) d[i] = Half(src[first + i]);
    }
    size_t payload = n * dtypeSize(dt);
    std::memset(static_cast<char*>(buffer_) + payload, 0, bytes - payload);
    transfer(true, offset, bytes);
  });
}

}  // namespace strata::zero
