#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "TestUtil.h"
#include "strata/core/Checksum.h"
#include "strata/data/Data.h"

using namespace strata;
using namespace strata::data;
namespace fs = std::filesystem;

namespace {

// The .tokens.bin files in a token cache directory.
std::vector<fs::path> cacheFiles(const fs::path& cacheDir) {
  std::vector<fs::path> bins;
  for (const auto& entry : fs::directory_iterator(cacheDir)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 11 && name.substr(name.size() - 11) == ".tokens.bin") bins.push_back(entry.path());
  }
  return bins;
}

fs::path onlyCacheFile(const fs::path& cacheDir) {
  auto bins = cacheFiles(cacheDir);
  REQUIRE(bins.size() == 1);
  return bins[0];
}

std::vector<int64_t> allTokens(const TokenDataset& data) {
  std::vector<int64_t> tokens(size_t(data.size()));
  for (int64_t i = 0; i < data.size(); ++i) tokens[size_t(i)] = data.token(i);
  return tokens;
}

std::vector<int64_t> bytesOf(const std::string& text) {
  return std::vector<int64_t>(text.begin(), text.end());
}

fs::path freshDir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The byte tokenizer's ids plus one: a tokenizer whose tokens differ, under its own identity.
class ShiftedByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    auto ids = ByteTokenizer().encode(text);
    for (auto& id : ids) ++id;
    return ids;
  }
  std::string decode(const std::vector<int32_t>&) const override { return ""; }
  int64_t vocabSize() const override { return 257; }
  std::string identity() const override { return "byte+1"; }
};

}  // namespace

TEST_CASE("byte tokenizer round-trips any text", "[train][data]") {
  ByteTokenizer tok;
  std::string text = "ROMEO:\nBut soft! \xc3\xa9\x01";
  auto ids = tok.encode(text);
  REQUIRE(ids.size() == text.size());
  REQUIRE(ids[0] == 'R');
  REQUIRE(ids[ids.size() - 3] == 0xc3);
  REQUIRE(tok.decode(ids) == text);
}

TEST_CASE("text is cached as tokens and batches are deterministic next-token windows", "[train][data]") {
  fs::path dir = fs::temp_directory_path() / "strata-data-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += char('a' + i % 26);
  { std::ofstream(dir / "corpus.txt") << text; }
  ByteTokenizer tok;
  auto data = TokenDataset::open((dir / "corpus.txt").string(), "text", tok, (dir / "cache").string(), 0.1);
  REQUIRE(data.size() == 2000);
  REQUIRE(data.splitSize(Split::Train) == 1800);
  REQUIRE(data.splitSize(Split::Val) == 200);
  fs::path cached = onlyCacheFile(dir / "cache");
  REQUIRE(cached.filename().string().rfind("corpus-", 0) == 0);
  REQUIRE(fs::exists(fs::path(cached).replace_extension(".json")));
  auto [x, y] = data.batch(Split::Train, 3, 4, 16, 7, Device::cpu());
  REQUIRE(x.shape() == Shape{4, 16});
  auto xv = x.toVector<int64_t>(), yv = y.toVector<int64_t>();
  for (size_t i = 0; i < xv.size(); ++i) {
    if (i % 16 != 15) REQUIRE(yv[i] == xv[i + 1]);  // targets are inputs shifted by one
    REQUIRE((yv[i] - 'a' + 26) % 26 == (xv[i] - 'a' + 1) % 26);
  }
  auto [x2, y2] = data.batch(Split::Train, 3, 4, 16, 7, Device::cpu());
  REQUIRE(x2.toVector<int64_t>() == xv);
  auto [x3, y3] = data.batch(Split::Train, 4, 4, 16, 7, Device::cpu());
  REQUIRE(x3.toVector<int64_t>() != xv);
  // Validation windows stay inside the tail.
  auto [vx, vy] = data.batch(Split::Val, 0, 8, 16, 7, Device::cpu());
  REQUIRE(vx.defined());
  // A nanoGPT .bin of the cached tokens reads back the same.
  auto again = TokenDataset::open(cached.string(), "nanogpt", tok, "", 0.1);
  REQUIRE(again.size() == 2000);
  REQUIRE(again.token(5) == 'f');
  REQUIRE(again.maxToken() == 'z');
  REQUIRE_THROWS_AS(data.batch(Split::Val, 0, 1, 500, 7, Device::cpu()), Error);
}

TEST_CASE("megatron .bin/.idx pairs are read through the index's dtype", "[train][data]") {
  fs::path dir = fs::temp_directory_path() / "strata-megatron-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<uint16_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12};
  {
    std::ofstream bin(dir / "c_text_document.bin", std::ios::binary);
    bin.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
    std::ofstream idx(dir / "c_text_document.idx", std::ios::binary);
    idx.write("MMIDIDX\x00\x00", 9);
    uint64_t version = 1;
    idx.write(reinterpret_cast<const char*>(&version), 8);
    uint8_t code = 8;  // uint16
    idx.write(reinterpret_cast<const char*>(&code), 1);
  }
  ByteTokenizer tok;
  auto data = TokenDataset::open((dir / "c_text_document").string(), "megatron", tok, "", 0.0);
  REQUIRE(data.size() == 8);
  REQUIRE(data.token(7) == 12);
  { std::ofstream(dir / "bad.idx") << "not an index"; }
  { std::ofstream(dir / "bad.bin") << "xx"; }
  REQUIRE_THROWS_AS(TokenDataset::open((dir / "bad.bin").string(), "megatron", tok, "", 0.0), Error);
}

TEST_CASE("random token datasets are uniform, in range and a function of the seed", "[train][data]") {
  auto a = data::TokenDataset::random(1000, 50000, 7, 0.1),
       b = data::TokenDataset::random(1000, 50000, 7, 0.1);
  auto c = data::TokenDataset::random(1000, 50000, 8, 0.1);
  REQUIRE(a.size() == 50000);
  REQUIRE(a.splitSize(data::Split::Val) == 5000);
  REQUIRE(a.maxToken() < 1000);
  double mean = 0;
  bool differs = false;
  for (int64_t i = 0; i < a.size(); ++i) {
    REQUIRE(a.token(i) == b.token(i));
    differs = differs || a.token(i) != c.token(i);
    mean += double(a.token(i));
  }
  REQUIRE(differs);
  REQUIRE(mean / double(a.size()) == Approx(499.5).margin(10));
  REQUIRE_THROWS(data::TokenDataset::random(70000, 10, 1, 0.0));
}

TEST_CASE("the token cache keeps two files of one name in two folders apart", "[train][data]") {
  fs::path dir = freshDir("strata-cache-names-test");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  { std::ofstream(dir / "a" / "input.txt") << "first corpus, in folder a"; }
  { std::ofstream(dir / "b" / "input.txt") << "second corpus, from folder b"; }
  ByteTokenizer tok;
  std::string cache = (dir / "cache").string();
  auto first = TokenDataset::open((dir / "a" / "input.txt").string(), "text", tok, cache, 0.0);
  auto second = TokenDataset::open((dir / "b" / "input.txt").string(), "text", tok, cache, 0.0);
  REQUIRE(allTokens(first) == bytesOf("first corpus, in folder a"));
  REQUIRE(allTokens(second) == bytesOf("second corpus, from folder b"));
  REQUIRE(cacheFiles(dir / "cache").size() == 2);
  // A relative path to the same file is the same input.
  fs::path cwd = fs::current_path();
  fs::current_path(dir);
  auto relative = TokenDataset::open("a/../a/input.txt", "text", tok, cache, 0.0);
  fs::current_path(cwd);
  REQUIRE(allTokens(relative) == bytesOf("first corpus, in folder a"));
  REQUIRE(cacheFiles(dir / "cache").size() == 2);
}

TEST_CASE("the token cache re-tokenizes a file replaced with an older mtime or the same size and mtime",
          "[train][data]") {
  fs::path dir = freshDir("strata-cache-replaced-test");
  fs::path input = dir / "input.txt";
  { std::ofstream(input) << "the original text"; }
  ByteTokenizer tok;
  std::string cache = (dir / "cache").string();
  REQUIRE(allTokens(TokenDataset::open(input.string(), "text", tok, cache, 0.0)) ==
          bytesOf("the original text"));

  // What tar x or cp -p do: new contents with an older time than the cache.
  auto old = fs::last_write_time(input) - std::chrono::hours(24 * 365);
  { std::ofstream(input) << "a replacement, longer than the original"; }
  fs::last_write_time(input, old);
  REQUIRE(fs::last_write_time(input) < fs::last_write_time(onlyCacheFile(dir / "cache")));
  REQUIRE(allTokens(TokenDataset::open(input.string(), "text", tok, cache, 0.0)) ==
          bytesOf("a replacement, longer than the original"));
  REQUIRE(cacheFiles(dir / "cache").size() == 1);  // the superseded cache is removed

  // Same size and the very same mtime: only the content hash tells them apart.
  { std::ofstream(input) << "A REPLACEMENT, LONGER THAN THE ORIGINAL"; }
  fs::last_write_time(input, old);
  REQUIRE(allTokens(TokenDataset::open(input.string(), "text", tok, cache, 0.0)) ==
          bytesOf("A REPLACEMENT, LONGER THAN THE ORIGINAL"));
  REQUIRE(cacheFiles(dir / "cache").size() == 1);
}

TEST_CASE("the token cache is reused for the same file and tokenizer", "[train][data]") {
  fs::path dir = freshDir("strata-cache-reuse-test");
  { std::ofstream(dir / "input.txt") << "some text to cache once"; }
  ByteTokenizer tok;
  std::string cache = (dir / "cache").string();
  TokenDataset::open((dir / "input.txt").string(), "text", tok, cache, 0.0);
  fs::path cached = onlyCacheFile(dir / "cache");
  struct stat before {};
  REQUIRE(::stat(cached.c_str(), &before) == 0);
  auto again = TokenDataset::open((dir / "input.txt").string(), "text", tok, cache, 0.0);
  REQUIRE(allTokens(again) == bytesOf("some text to cache once"));
  struct stat after {};
  REQUIRE(::stat(cached.c_str(), &after) == 0);
  REQUIRE(after.st_ino == before.st_ino);  // a rewrite renames a new file into place
  REQUIRE(after.st_mtim.tv_sec == before.st_mtim.tv_sec);
  REQUIRE(after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
  REQUIRE(onlyCacheFile(dir / "cache") == cached);
  // The sidecar records the key the cache was made for.
  nlohmann::json recorded = nlohmann::json::parse(std::ifstream(fs::path(cached).replace_extension(".json")));
  REQUIRE(recorded.at("path") == fs::canonical(dir / "input.txt").string());
  REQUIRE(recorded.at("size") == 23);
  REQUIRE(recorded.at("crc32c") == crc32cFile((dir / "input.txt").string()));
  REQUIRE(recorded.at("tokenizer") == "byte");
  REQUIRE(recorded.at("tokens") == 23);
}

TEST_CASE("the token cache keeps tokenizers apart and never trusts a sidecar that disagrees",
          "[train][data]") {
  fs::path dir = freshDir("strata-cache-tokenizer-test");
  { std::ofstream(dir / "input.txt") << "abc"; }
  ByteTokenizer bytes;
  ShiftedByteTokenizer shifted;
  std::string cache = (dir / "cache").string();
  REQUIRE(allTokens(TokenDataset::open((dir / "input.txt").string(), "text", bytes, cache, 0.0)) ==
          std::vector<int64_t>{'a', 'b', 'c'});
  REQUIRE(allTokens(TokenDataset::open((dir / "input.txt").string(), "text", shifted, cache, 0.0)) ==
          std::vector<int64_t>{'b', 'c', 'd'});
  REQUIRE(cacheFiles(dir / "cache").size() == 2);
  REQUIRE(allTokens(TokenDataset::open((dir / "input.txt").string(), "text", bytes, cache, 0.0)) ==
          std::vector<int64_t>{'a', 'b', 'c'});

  // A cache is rebuilt, not trusted, when its .bin has the wrong size, its sidecar is gone (a crash between
  // the two writes) or its sidecar records another key.
  auto tamper = [&](const std::function<void(const fs::path& bin, const fs::path& sidecar)>& change) {
    for (const auto& bin : cacheFiles(dir / "cache")) change(bin, fs::path(bin).replace_extension(".json"));
    REQUIRE(allTokens(TokenDataset::open((dir / "input.txt").string(), "text", bytes, cache, 0.0)) ==
            std::vector<int64_t>{'a', 'b', 'c'});
    REQUIRE(allTokens(TokenDataset::open((dir / "input.txt").string(), "text", shifted, cache, 0.0)) ==
            std::vector<int64_t>{'b', 'c', 'd'});
  };
  auto writeTokens = [](const fs::path& bin, std::vector<uint16_t> tokens) {
    std::ofstream(bin, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  };
  tamper([&](const fs::path& bin, const fs::path&) { writeTokens(bin, {'x', 'y'}); });
  tamper([&](const fs::path& bin, const fs::path& sidecar) {
    writeTokens(bin, {'x', 'y', 'z'});
    fs::remove(sidecar);
  });
  tamper([&](const fs::path& bin, const fs::path& sidecar) {
    writeTokens(bin, {'x', 'y', 'z'});
    nlohmann::json recorded = nlohmann::json::parse(std::ifstream(sidecar));
    recorded["mtime_ns"] = recorded["mtime_ns"].get<int64_t>() + 1;
    std::ofstream(sidecar) << recorded.dump();
  });
}

TEST_CASE("runs that fill one token cache at once all read whole, correct tokens", "[train][data]") {
  fs::path dir = freshDir("strata-cache-concurrent-test");
  std::string text;
  for (int i = 0; i < 300000; ++i) text += char('a' + (i * 7) % 26);
  { std::ofstream(dir / "input.txt") << text; }
  ByteTokenizer tok;
  std::vector<std::vector<int64_t>> seen(4);
  std::vector<std::thread> runs;
  for (size_t r = 0; r < seen.size(); ++r) {
    runs.emplace_back([&, r] {
      seen[r] = allTokens(
          TokenDataset::open((dir / "input.txt").string(), "text", tok, (dir / "cache").string(), 0.0));
    });
  }
  for (auto& run : runs) run.join();
  for (const auto& tokens : seen) REQUIRE(tokens == bytesOf(text));
  // One cache and its sidecar; no temporary file is left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir / "cache")) ++files;
  REQUIRE(files == 2);
  REQUIRE(cacheFiles(dir / "cache").size() == 1);
}
