#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/train/Data.h"

using namespace strata;
using namespace strata::train;

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
  namespace fs = std::filesystem;
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
  REQUIRE(fs::exists(dir / "cache" / "corpus.tokens.bin"));
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
  auto again = TokenDataset::open((dir / "cache" / "corpus.tokens.bin").string(), "nanogpt", tok, "", 0.1);
  REQUIRE(again.size() == 2000);
  REQUIRE(again.token(5) == 'f');
  REQUIRE(again.maxToken() == 'z');
  REQUIRE_THROWS_AS(data.batch(Split::Val, 0, 1, 500, 7, Device::cpu()), Error);
}

TEST_CASE("megatron .bin/.idx pairs are read through the index's dtype", "[train][data]") {
  namespace fs = std::filesystem;
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
  auto a = train::TokenDataset::random(1000, 50000, 7, 0.1),
       b = train::TokenDataset::random(1000, 50000, 7, 0.1);
  auto c = train::TokenDataset::random(1000, 50000, 8, 0.1);
  REQUIRE(a.size() == 50000);
  REQUIRE(a.splitSize(train::Split::Val) == 5000);
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
  REQUIRE_THROWS(train::TokenDataset::random(70000, 10, 1, 0.0));
}
