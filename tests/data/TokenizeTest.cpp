#include "strata/data/Tokenize.h"

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "TestUtil.h"
#include "TinyGpt2Vocab.h"
#include "strata/core/Checksum.h"

using namespace strata;
using namespace strata::data;
namespace fs = std::filesystem;

using strata::test::errorOf;
using strata::test::freshDir;

namespace {

// Mixed text that exercises every pre-token rule: words (some in the vocabulary), digits, punctuation,
// contractions, single and repeated spaces, tabs, "\n\n" and longer blank runs, CR LF, UTF-8 letters and
// symbols, and long stretches with no split point in them.
std::string mixedText(size_t bytes, uint32_t seed) {
  // clang-format off
  static const std::vector<std::string> pieces = {
      "the", " the", "and", " and", "hello", " world", "ing", " in", "x", "Q", "a.b", "  word",
      "12", " 123", "4",
      ".", ",", "!!", "?!", "(", ")", "-", "--", "\x01", " .\n",
      "'s", "'t", "'re", "'ll", "'d", "'ve", "'m", "'", "''s",
      " ", "  ", "   ", "     ", "\n", "\n\n", "\n\n\n", " \n", "\n ", "\t", "\r\n", "\v", "\f",
      "\xc3\xa9t\xc3\xa9", " \xe2\x80\x94 ", "\xe6\x97\xa5\xe6\x9c\xac"};
  // clang-format on
  std::mt19937 rng(seed);
  std::string text;
  size_t nextStretch = bytes / 3;
  while (text.size() < bytes) {
    text += pieces[rng() % pieces.size()];
    if (text.size() >= nextStretch) {
      // 40 KB without a split point: a whitespace run, then one long word.
      text += std::string(20000, ' ') + "\n\n" + std::string(20000, '\n') + " ";
      for (int i = 0; i < 10000; ++i) text += "xy";
      nextStretch += bytes / 3;
    }
  }
  return text;
}

std::vector<uint16_t> readBin(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string s = bytes.str();
  REQUIRE(s.size() % 2 == 0);
  std::vector<uint16_t> tokens(s.size() / 2);
  std::memcpy(tokens.data(), s.data(), s.size());
  return tokens;
}

std::vector<uint16_t> asUint16(const std::vector<int32_t>& ids) {
  return std::vector<uint16_t>(ids.begin(), ids.end());
}

}  // namespace

TEST_CASE("tokenizeFile gives exactly encode(whole file) for any thread count and block size",
          "[train][tokenize]") {
  fs::path dir = freshDir("strata-tokenize-test");
  auto [vocab, merges] = test::writeTinyGpt2Vocab(dir);
  Gpt2Tokenizer tok(vocab, merges);
  std::string text = mixedText(size_t(2) << 20, 1);
  { std::ofstream(dir / "input.txt", std::ios::binary) << text; }
  std::vector<uint16_t> expected = asUint16(tok.encode(text));
  REQUIRE(expected.size() > text.size() / 4);
  REQUIRE(expected.size() < text.size());  // the merges took effect

  for (int threads : {1, 2, 4}) {
    for (int64_t blockBytes : {int64_t(777), int64_t(64) << 10, int64_t(4) << 20}) {
      INFO("threads " << threads << ", blockBytes " << blockBytes);
      TokenizeOptions options;
      options.threads = threads;
      options.blockBytes = blockBytes;
      std::vector<std::pair<int64_t, int64_t>> calls;
      options.progress = [&](int64_t done, int64_t total) { calls.emplace_back(done, total); };
      fs::path out = dir / ("out-" + std::to_string(threads) + "-" + std::to_string(blockBytes) + ".bin");
      TokenizeResult result = tokenizeFile((dir / "input.txt").string(), out.string(), tok, options);
      REQUIRE(result.bytes == int64_t(text.size()));
      REQUIRE(result.tokens == int64_t(expected.size()));
      REQUIRE(result.inputCrc32c == crc32c(text.data(), text.size()));
      REQUIRE(readBin(out) == expected);
      REQUIRE(!calls.empty());
      REQUIRE(calls.back() == std::make_pair(int64_t(text.size()), int64_t(text.size())));
      for (size_t i = 1; i < calls.size(); ++i) REQUIRE(calls[i].first > calls[i - 1].first);
      // Small blocks make many waves, so progress is reported along the way.
      if (blockBytes == 777) REQUIRE(calls.size() > 10);
    }
  }
}

TEST_CASE("tokenizeFile with the byte tokenizer writes the bytes; empty input gives an empty .bin",
          "[train][tokenize]") {
  fs::path dir = freshDir("strata-tokenize-bytes-test");
  std::string text = mixedText(300000, 2);
  { std::ofstream(dir / "input.txt", std::ios::binary) << text; }
  ByteTokenizer bytes;
  TokenizeOptions options;
  options.threads = 3;
  options.blockBytes = 1000;
  tokenizeFile((dir / "input.txt").string(), (dir / "out.bin").string(), bytes, options);
  REQUIRE(readBin(dir / "out.bin") == asUint16(bytes.encode(text)));

  { std::ofstream(dir / "empty.txt"); }
  int64_t reportedTotal = -1;
  options.progress = [&](int64_t done, int64_t total) { reportedTotal = total; };
  TokenizeResult result =
      tokenizeFile((dir / "empty.txt").string(), (dir / "empty.bin").string(), bytes, options);
  REQUIRE(result.tokens == 0);
  REQUIRE(reportedTotal == 0);
  REQUIRE(fs::exists(dir / "empty.bin"));
  REQUIRE(fs::file_size(dir / "empty.bin") == 0);
}

TEST_CASE("tokenizeFile refuses a vocabulary over 65536, a missing input and a failed write",
          "[train][tokenize]") {
  fs::path dir = freshDir("strata-tokenize-errors-test");
  { std::ofstream(dir / "input.txt") << mixedText(100000, 3); }
  std::string input = (dir / "input.txt").string(), output = (dir / "out.bin").string();

  auto [vocab, merges] = test::writeTinyGpt2Vocab(dir / "big", {"the"}, {{"unused", 65536}});
  Gpt2Tokenizer big(vocab, merges);
  REQUIRE(big.vocabSize() == 65537);
  std::string message = errorOf([&] { tokenizeFile(input, output, big); });
  REQUIRE(message.find("65537") != std::string::npos);
  REQUIRE(message.find(output) != std::string::npos);
  REQUIRE(!fs::exists(output));

  ByteTokenizer bytes;
  message = errorOf([&] { tokenizeFile((dir / "missing.txt").string(), output, bytes); });
  REQUIRE(message.find("missing.txt") != std::string::npos);

  // A file size limit fails the write as a full disk would: an error naming the output, and no file, whole
  // or partial, left behind.
  struct rlimit saved {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto oldHandler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  message = errorOf([&] { tokenizeFile(input, output, bytes); });
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, oldHandler);
  INFO(message);
  REQUIRE(message.find("cannot write " + output) != std::string::npos);
  REQUIRE(!fs::exists(output));
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++files;
  REQUIRE(files == 2);  // input.txt and big/: the temporary file is gone
}
