// CRC32C (Castagnoli): checkpoint files, token caches and TensorBoard records carry it.
//
// The SSE4.2 crc32 instruction runs when the CPU has it (8 bytes per instruction), else a byte table; both
// give the same value. The checksum is incremental: crc32c(b, nb, crc32c(a, na)) is the CRC
// of a followed by b, so large files are checked in streamed blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The CRC32C of a whole file, read in blocks. Throws strata::Error naming the file when it cannot be read.
uint32_t crc32cFile(const std::string& path);

}  // namespace strata
