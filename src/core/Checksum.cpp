#include "strata/core/Checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "strata/core/Error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace strata {
namespace {

uint32_t crc32cTable(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32cHardware(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(uint32_t(c), *p++);
    --n;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(uint32_t(c), *p++);
  return uint32_t(c);
}

bool haveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (haveSse42()) return ~crc32cHardware(p, n, c);
#endif
  return ~crc32cTable(p, n, c);
}

uint32_t crc32cFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  STRATA_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  std::vector<char> buf(size_t(8) << 20);
  uint32_t crc = 0;
  for (;;) {
    ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int err = errno;
      ::close(fd);
      STRATA_CHECK(got == 0, "cannot read {}: {}", path, std::strerror(err));
      return crc;
    }
    crc = crc32c(buf.data(), size_t(got), crc);
  }
}

}  // namespace strata
