#include "strata/zero/NvmeTier.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "NvmeIo.h"
#include "strata/core/Error.h"
#include "strata/core/FileError.h"

namespace strata::zero {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kAlign = 4096;
// More threads than this give a disk nothing.
constexpr int64_t kMaxThreads = 64;

uint64_t alignUp(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

NvmeBackend backendFromEnvironment() {
  const char* name = std::getenv("STRATA_NVME_BACKEND");
  if (name == nullptr || *name == 0) return NvmeBackend::Auto;
  std::string s = name;
  if (s == "uring" || s == "io_uring") return NvmeBackend::Uring;
  if (s == "threads") return NvmeBackend::Threads;
  STRATA_USER_FAIL("STRATA_NVME_BACKEND is '{}': use uring or threads", s);
}

// The backend in use, in the log once per process and backend.
void logBackend(const std::string& line) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(line).second) spdlog::info("{}", line);
}

constexpr const char* kFilePrefix = "strata-state-rank";

// This machine's name as tier files carry it (a directory may be shared between machines).
std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == 0) return "localhost";
  std::string out = name;
  for (char& ch : out)
    if (ch == '/') ch = '_';
  return out;
}

// A tier file's name: strata-state-rank<R>-<host>-<PID>.bin.
std::string tierFileName(int rank, const std::string& host, long pid) {
  return kFilePrefix + std::to_string(rank) + "-" + host + "-" + std::to_string(pid) + ".bin";
}

// The PID of a tier file made on `host`, or -1 when `name` is not one (another machine's, or not a tier
// file).
long pidOfTierFile(const std::string& name, const std::string& host) {
  size_t prefix = std::strlen(kFilePrefix);
  if (name.rfind(kFilePrefix, 0) != 0 || name.size() < prefix + 6 || name.substr(name.size() - 4) != ".bin")
    return -1;
  size_t rankEnd = name.find('-', prefix), pidStart = name.rfind('-');
  if (rankEnd == std::string::npos || rankEnd == prefix || pidStart <= rankEnd) return -1;
  std::string rank = name.substr(prefix, rankEnd - prefix);
  std::string pid = name.substr(pidStart + 1, name.size() - 4 - pidStart - 1);
  if (name.substr(rankEnd + 1, pidStart - rankEnd - 1) != host || pid.empty() ||
      rank.find_first_not_of("0123456789") != std::string::npos ||
      pid.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::strtol(pid.c_str(), nullptr, 10);
}

}  // namespace

uint64_t removeStaleTierFiles(const std::string& directory) {
  std::error_code ec;
  if (directory.empty() || !fs::is_directory(directory, ec)) return 0;
  std::string host = hostName();
  uint64_t removed = 0;
  fs::directory_iterator it(directory, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path path = it->path();
    long pid = pidOfTierFile(path.filename().string(), host);
    if (pid <= 0 || pid == long(::getpid())) continue;
    if (::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;  // its process lives (or is not ours to see)
    // Read-write: where flock is emulated with fcntl locks (NFS), an exclusive lock needs it.
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    // A live tier holds a shared lock on its file; and the name must still be this file (a new tier may have
    // replaced it between the directory read and the lock).
    struct stat opened = {};
    struct stat named = {};
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &opened) == 0 &&
        ::stat(path.c_str(), &named) == 0 && opened.st_dev == named.st_dev && opened.st_ino == named.st_ino &&
        ::unlink(path.c_str()) == 0) {
      uint64_t bytes = uint64_t(opened.st_size);
      removed += bytes;
      spdlog::warn("removed {} ({:.2f} GiB): the SSD tier's file of a run that ended without removing it",
                   path.string(), double(bytes) / double(1 << 30));
    }
    ::close(fd);
  }
  return removed;
}

namespace {
std::vector<NvmeTier::ChunkFields> uniformFields(const std::vector<int64_t>& elems, DType stateDType) {
  std::vector<NvmeTier::ChunkFields> out;
  for (int64_t n : elems) out.push_back(NvmeTier::ChunkFields::uniform(n, stateDType));
  return out;
}
}  // namespace

NvmeTier::NvmeTier(const std::string& directory, int rank, const std::vector<int64_t>& elems,
                   DType stateDType, const NvmeIoConfig& io)
    : NvmeTier(directory, rank, stateDType, uniformFields(elems, stateDType), io) {}

NvmeTier::NvmeTier(const std::string& directory, int rank, DType stateDType,
                   const std::vector<ChunkFields>& chunks, const NvmeIoConfig& io)
    : stateDType_(stateDType), chunks_(chunks) {
  STRATA_USER_CHECK(io.blockBytes >= int64_t(kAlign) && io.blockBytes <= (int64_t(1) << 30),
                    "zero_optimization.aio.block_size must be from 4096 bytes to 1 GiB, not {}",
                    io.blockBytes);
  STRATA_USER_CHECK(io.queueDepth >= 1 && io.queueDepth <= 4096,
                    "zero_optimization.aio.queue_depth must be from 1 to 4096, not {}", io.queueDepth);
  NvmeBackend backend = io.backend == NvmeBackend::Auto ? backendFromEnvironment() : io.backend;
  STRATA_USER_CHECK(
      backend != NvmeBackend::Uring || uringBuilt(),
      "the SSD tier's io_uring backend was asked for (STRATA_NVME_BACKEND=uring), but this build "
      "has no liburing: install liburing-dev (or pass its folder in CMAKE_PREFIX_PATH) and "
      "rebuild, or use STRATA_NVME_BACKEND=threads");
  auto storable = [](DType dt) { return dt == DType::F32 || dt == DType::BF16 || dt == DType::F16; };
  STRATA_USER_CHECK(storable(stateDType), "store.nvme_state_dtype must be fp32, bf16 or fp16");
  for (const ChunkFields& fields : chunks_)
    for (int f = 0; f < kFields; ++f)
      STRATA_CHECK(fields.elems[f] >= 0 && storable(fields.dtypes[f]) &&
                       (f != Master || fields.dtypes[f] == DType::F32),
                   "the SSD tier stores an fp32 master and fp32, bf16 or fp16 state and parameters");
  STRATA_USER_CHECK(
      !directory.empty(),
      "the SSD tier needs a directory: set zero_optimization.nvme_path (e.g. a folder on the SSD)");
  std::error_code ec;
  fs::create_directories(directory, ec);
  STRATA_USER_CHECK(fs::is_directory(directory), "zero_optimization.nvme_path {} is not a directory{}",
                    directory, ec ? ": " + ec.message() : std::string());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    std::array<uint64_t, kFields> at{};
    bool state = holds(c);
    for (int f = 0; f < kFields; ++f) {
      at[size_t(f)] = fileBytes_;
      if (f < kStateFields && !state) continue;  // no state here: its other fields take no room
      fileBytes_ += alignUp(fieldBytes(c, Field(f)));
      (f < kStateFields ? stateBytes_ : parameterBytes_) += fieldBytes(c, Field(f));
    }
    offsets_.push_back(at);
  }
  path_ = (fs::path(directory) / tierFileName(rank, hostName(), long(::getpid()))).string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0 && errno == EINVAL) {
    direct_ = false;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    spdlog::warn("{}: the file system refuses O_DIRECT; the SSD tier uses buffered I/O", directory);
  }
  STRATA_USER_CHECK(fd_ >= 0, "cannot create the SSD tier's file {}: {}", path_, std::strerror(errno));
  // Held while the tier lives (the kernel drops it when the process ends, however it ends): another run's
  // removeStaleTierFiles leaves the file alone.
  if (::flock(fd_, LOCK_SH | LOCK_NB) != 0)
    spdlog::warn("{}: no lock on the SSD tier's file ({}); another run could take it for a stale one", path_,
                 std::strerror(errno));
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
          fileBytes_, path_, fileErrorText(err));
    }
  }
  blockBytes_ = size_t(io.blockBytes) / kAlign * kAlign;
  // A checksum per piece of every field (NOTE [SSD tier]: pieces are cut the same way on every transfer).
  checksums_.resize(chunks_.size());
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int f = 0; f < kFields; ++f) {
      size_t perPiece = blockBytes_ / dtypeSize(chunks_[c].dtypes[size_t(f)]);
      checksums_[c][size_t(f)].resize((size_t(chunks_[c].elems[size_t(f)]) + perPiece - 1) / perPiece);
    }
  // The staging buffers need be no larger than the largest field.
  uint64_t largestField = 0;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int f = 0; f < kFields; ++f) largestField = std::max(largestField, alignUp(fieldBytes(c, Field(f))));
  size_t pieceBytes = std::max<size_t>(kAlign, std::min<size_t>(blockBytes_, largestField));
  int depth = int(io.queueDepth);
  std::string why;
  if (backend != NvmeBackend::Threads) {
    backend_ = detail::makeUringBackend(fd_, path_, depth, pieceBytes, why);
    if (!backend_ && backend == NvmeBackend::Uring)
      spdlog::warn("the SSD tier cannot use io_uring ({}); it uses a pread/pwrite thread pool", why);
  }
  if (!backend_) {
    depth = int(std::min<int64_t>(depth, kMaxThreads));
    backend_ = detail::makeThreadsBackend(fd_, path_, depth, pieceBytes);
  }
  logBackend(strata::detail::format(
      "SSD tier: {} backend, {} transfers of up to {} KiB in flight{}", backend_->name(), depth,
      pieceBytes / 1024, why.empty() || backend == NvmeBackend::Threads ? std::string() : " (" + why + ")"));
  ioThread_ = std::thread([this] { ioLoop(); });
}

NvmeTier::~NvmeTier() {
  if (ioThread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    queued_.notify_all();
    ioThread_.join();  // after the jobs queued before it
  }
  backend_.reset();
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
}

bool NvmeTier::uringBuilt() {
#if STRATA_HAVE_LIBURING
  return true;
#else
  return false;
#endif
}

const char* NvmeTier::backendName() const {
  return backend_->name();
}

void NvmeTier::release(size_t chunk) {
  if (!holds(chunk)) return;
  stateBytes_ -= chunkStateBytes(chunk);
  // The fields' offsets stay (the parameters' too); nothing reads the state again.
  for (int f = 0; f < kStateFields; ++f) chunks_[chunk].elems[size_t(f)] = 0;
}

uint64_t NvmeTier::chunkStateBytes(size_t chunk) const {
  uint64_t bytes = 0;
  if (holds(chunk))
    for (int f = 0; f < kStateFields; ++f) bytes += fieldBytes(chunk, Field(f));
  return bytes;
}

size_t NvmeTier::fieldBytes(size_t chunk, Field f) const {
  return size_t(chunks_[chunk].elems[f]) * dtypeSize(chunks_[chunk].dtypes[f]);
}

uint64_t NvmeTier::offsetOf(size_t chunk, Field f) const {
  return offsets_[chunk][size_t(f)];
}

NvmeTier::Ticket NvmeTier::submit(bool write, size_t chunk, const std::vector<FieldValues>& fields) {
  Job job{0, write, {}};
  for (const FieldValues& fv : fields) {
    STRATA_CHECK(fv.field == Parameters ? holdsParameters(chunk) : holds(chunk),
                 "chunk {} has no {} on the SSD tier", chunk,
                 fv.field == Parameters ? "parameters" : "optimizer state");
    DType dt = chunks_[chunk].dtypes[fv.field];
    int64_t elems = chunks_[chunk].elems[fv.field];
    STRATA_CHECK(fv.dtype == DType::F32 || fv.dtype == dt,
                 "the SSD tier moves fp32 values, or values in the stored dtype ({}), not {}", dt, fv.dtype);
    size_t esize = dtypeSize(dt), perPiece = blockBytes_ / esize;
    uint64_t base = offsetOf(chunk, fv.field);
    std::vector<detail::PieceChecksum>& sums = checksums_[chunk][fv.field];
    for (int64_t first = 0; first < elems; first += int64_t(perPiece)) {
      size_t n = size_t(std::min<int64_t>(int64_t(perPiece), elems - first));
      job.pieces.push_back(
          detail::IoPiece{base + uint64_t(first) * esize, size_t(alignUp(n * esize)), n, dt,
                          static_cast<char*>(fv.values) + size_t(first) * dtypeSize(fv.dtype), fv.dtype,
                          &sums[size_t(first) / perPiece]});
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  job.ticket = ++issued_;
  jobs_.push_back(std::move(job));
  queued_.notify_one();
  return issued_;
}

void NvmeTier::ioLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, with nothing left
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    bool skip = failedAt_ != 0;  // after a failure nothing more is moved
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        backend_->run(job.write, job.pieces);
        uint64_t bytes = 0;
        for (const auto& p : job.pieces) bytes += p.bytes;
        (job.write ? bytesWritten_ : bytesRead_) += bytes;
      } catch (...) {
        failure = std::current_exception();
      }
    }
    lock.lock();
    if (failure) {
      failedAt_ = job.ticket;
      failure_ = failure;
    }
    done_ = job.ticket;
    ended_.notify_all();
  }
}

NvmeTier::Ticket NvmeTier::readAsync(size_t chunk, const std::vector<FieldValues>& fields) {
  return submit(false, chunk, fields);
}

NvmeTier::Ticket NvmeTier::writeAsync(size_t chunk, const std::vector<FieldValues>& fields) {
  return submit(true, chunk, fields);
}

void NvmeTier::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  ended_.wait(lock, [&] { return done_ >= ticket; });
  if (failedAt_ != 0 && failedAt_ <= ticket) std::rethrow_exception(failure_);
}

void NvmeTier::drain() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  ended_.wait(lock, [&] { return done_ >= issued_; });
}

void NvmeTier::read(size_t chunk, Field f, float* dst) {
  wait(readAsync(chunk, {{f, dst, DType::F32}}));
}

void NvmeTier::write(size_t chunk, Field f, const float* src) {
  // The values are only read: the write encodes them into the staging buffers.
  wait(writeAsync(chunk, {{f, const_cast<float*>(src), DType::F32}}));
}

}  // namespace strata::zero
