#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/core/Checksum.h"

using namespace strata;

TEST_CASE("crc32c matches the standard check value and is incremental", "[core][checksum]") {
  REQUIRE(crc32c("123456789", 9) == 0xE3069283u);
  REQUIRE(crc32c("", 0) == 0u);
  // Any split point, aligned or not, gives the CRC of the whole.
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(char(i * 37 + 11));
  uint32_t whole = crc32c(text.data(), text.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(13), size_t(999), size_t(1000)})
    REQUIRE(crc32c(text.data() + cut, text.size() - cut, crc32c(text.data(), cut)) == whole);
  // One flipped bit changes it.
  text[500] ^= 4;
  REQUIRE(crc32c(text.data(), text.size()) != whole);
}

TEST_CASE("crc32cFile streams a file and names a missing one", "[core][checksum]") {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() / "strata-crc-file.bin";
  std::string text(3 << 20, 'x');
  for (size_t i = 0; i < text.size(); i += 4097) text[i] = char(i);
  { std::ofstream(p, std::ios::binary) << text; }
  REQUIRE(crc32cFile(p.string()) == crc32c(text.data(), text.size()));
  try {
    crc32cFile("/nonexistent/strata.bin");
    FAIL("expected an error");
  } catch (const Error& e) {
    REQUIRE(std::string(e.what()).find("/nonexistent/strata.bin") != std::string::npos);
  }
}
