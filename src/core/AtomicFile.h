// Files that readers see whole or not at all: token caches, tokenized .bin outputs, checkpoint files.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata {

// Writes `path` through a temporary file with a unique name in the same directory: commit() fsyncs it and
// renames it over `path`, so a crash or a concurrent writer never leaves a partial file under that name.
// Every write is checked: a full disk is an error naming `path`, not a truncated file. Destroying the
// writer before commit() removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmpPath_;
  int fd_ = -1;
  bool committed_ = false;
};

// `contents` to `path` through an AtomicFileWriter.
void writeFileAtomically(const std::string& path, std::string_view contents);

}  // namespace strata
