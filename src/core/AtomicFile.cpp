#include "core/AtomicFile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "strata/core/Error.h"
#include "strata/core/FileError.h"

namespace strata {

namespace fs = std::filesystem;

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  fs::path target(path_);
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  // A hidden name in the target's directory, so the rename stays on one file system.
  std::string hidden = ".";
  hidden += target.filename().string();
  hidden += ".tmp-XXXXXX";
  std::string pattern = (dir / hidden).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);
  STRATA_USER_CHECK(fd_ >= 0, "cannot create a temporary file in {} to write {}: {}", dir.string(), path_,
                    std::strerror(errno));
  tmpPath_ = name.data();
  ::fchmod(fd_, 0644);  // mkostemp makes 0600; outputs are ordinary data files
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmpPath_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  STRATA_CHECK(fd_ >= 0 && !committed_, "write to {} after commit", path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t wrote = ::write(fd_, p, std::min<size_t>(bytes, size_t(1) << 30));
    if (wrote < 0 && errno == EINTR) continue;
    STRATA_USER_CHECK(wrote > 0, "cannot write {}: {}", path_,
                      wrote < 0 ? fileErrorText(errno) : "the write made no progress");
    p += wrote;
    bytes -= size_t(wrote);
  }
}

void AtomicFileWriter::commit() {
  STRATA_CHECK(fd_ >= 0 && !committed_, "{} committed twice", path_);
  // Data before name: after a crash the new name never points at blocks that did not reach the disk.
  STRATA_USER_CHECK(::fsync(fd_) == 0, "cannot write {}: fsync failed: {}", path_, fileErrorText(errno));
  int closed = ::close(fd_);
  fd_ = -1;
  STRATA_USER_CHECK(closed == 0, "cannot write {}: close failed: {}", path_, std::strerror(errno));
  STRATA_USER_CHECK(::rename(tmpPath_.c_str(), path_.c_str()) == 0, "cannot rename {} to {}: {}", tmpPath_,
                    path_, std::strerror(errno));
  committed_ = true;
  fs::path dir = fs::path(path_).parent_path();
  int dirFd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);  // makes the rename durable; a directory that refuses fsync still has it
    ::close(dirFd);
  }
}

void writeFileAtomically(const std::string& path, std::string_view contents) {
  AtomicFileWriter out(path);
  out.write(contents.data(), contents.size());
  out.commit();
}

}  // namespace strata
