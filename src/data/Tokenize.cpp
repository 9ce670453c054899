#include "strata/data/Tokenize.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <string_view>
#include <utility>
#include <vector>

#include "core/AtomicFile.h"
#include "strata/core/Checksum.h"
#include "strata/core/Error.h"

namespace strata::data {

namespace {

static_assert(std::endian::native == std::endian::little, "nanoGPT .bin files are little-endian uint16");

// A text file mapped read-only.
class MappedText {
 public:
  explicit MappedText(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    STRATA_USER_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
    struct stat st {};
    int statted = ::fstat(fd, &st);
    int statErrno = errno;
    if (statted == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      bytes_ = size_t(st.st_size);
      addr_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      statErrno = errno;
    }
    ::close(fd);
    STRATA_USER_CHECK(statted == 0, "cannot stat {}: {}", path, std::strerror(statErrno));
    STRATA_USER_CHECK(S_ISREG(st.st_mode), "{} is not a regular file", path);
    STRATA_USER_CHECK(addr_ != MAP_FAILED, "cannot map {}: {}", path, std::strerror(statErrno));
    if (addr_) ::madvise(addr_, bytes_, MADV_SEQUENTIAL);
  }
  ~MappedText() {
    if (addr_ && addr_ != MAP_FAILED) ::munmap(addr_, bytes_);
  }
  MappedText(const MappedText&) = delete;
  MappedText& operator=(const MappedText&) = delete;

  std::string_view text() const { return {static_cast<const char*>(addr_), addr_ ? bytes_ : 0}; }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

TokenizeResult tokenizeFile(const std::string& input, const std::string& output, const Tokenizer& tokenizer,
                            const TokenizeOptions& options) {
  auto started = std::chrono::steady_clock::now();
  STRATA_USER_CHECK(tokenizer.vocabSize() <= 65536,
                    "{}: a nanoGPT .bin holds uint16 tokens, but the tokenizer has {} (at most 65536)",
                    output, tokenizer.vocabSize());
  STRATA_CHECK(options.blockBytes > 0, "tokenizeFile: blockBytes must be positive, got {}",
               options.blockBytes);
  MappedText mapped(input);
  std::string_view text = mapped.text();
  const size_t total = text.size();
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();

  // The end of the block that starts at `begin`: the first split point blockBytes or more past it, else the
  // end of the text. Scanning forward from there extends a block that has no split point in reach.
  auto blockEnd = [&](size_t begin) {
    size_t pos = begin + size_t(options.blockBytes);
    if (pos >= total) return total;
    while (pos < total && !tokenizer.encodeSplitsAt(text, pos)) ++pos;
    return pos;
  };

  AtomicFileWriter out(output);
  TokenizeResult result;
  // Waves of a few blocks per thread: encoded in parallel, then written in order from this thread, so memory
  // stays a few blocks per thread whatever the file size.
  const size_t blocksPerWave = size_t(threads) * 4;
  std::vector<std::pair<size_t, size_t>> blocks;
  std::vector<std::vector<uint16_t>> encoded;
  size_t done = 0;
  while (done < total) {
    blocks.clear();
    for (size_t begin = done; begin < total && blocks.size() < blocksPerWave;) {
      size_t end = blockEnd(begin);
      blocks.emplace_back(begin, end);
      begin = end;
    }
    encoded.assign(blocks.size(), {});
    std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t b = 0; b < blocks.size(); ++b) {
      try {
        auto [begin, end] = blocks[b];
        std::vector<int32_t> ids = tokenizer.encode(std::string(text.substr(begin, end - begin)));
        std::vector<uint16_t>& packed = encoded[b];
        packed.resize(ids.size());
        for (size_t i = 0; i < ids.size(); ++i) {
          STRATA_CHECK(ids[i] >= 0 && ids[i] < 65536, "tokenizer gave id {}, outside uint16", ids[i]);
          packed[i] = uint16_t(ids[i]);
        }
      } catch (...) {
        // An exception must not leave the parallel region; the first one is rethrown below.
#pragma omp critical(strata_tokenize_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
    for (const auto& packed : encoded) {
      out.write(packed.data(), packed.size() * sizeof(uint16_t));
      result.tokens += int64_t(packed.size());
    }
    size_t waveEnd = blocks.back().second;
    result.inputCrc32c = crc32c(text.data() + done, waveEnd - done, result.inputCrc32c);
    done = waveEnd;
    if (options.progress && done < total) options.progress(int64_t(done), int64_t(total));
  }
  out.commit();
  result.bytes = int64_t(total);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (options.progress) options.progress(int64_t(total), int64_t(total));
  return result;
}

}  // namespace strata::data
