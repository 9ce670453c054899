#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/train/Data.h"

using namespace strata;
namespace fs = std::filesystem;

TEST_CASE("GPT-2 BPE applies merges by rank and round-trips", "[train][tokenizer]") {
  fs::path dir = fs::temp_directory_path() / "strata-bpe-test";
  fs::create_directories(dir);
  // A hand-made vocabulary in GPT-2's format: "\u0120" (\xc4\xa0) is the byte-level symbol for a space.
  {
    std::ofstream(dir / "vocab.json")
        << R"({"h":0,"e":1,"l":2,"o":3,"\u0120":4,"w":5,"r":6,"d":7,"he":8,"ll":9,"hell":10,"hello":11,)"
        << R"("\u0120w":12,"or":13,"\u0120wor":14,"!":15,"'s":16,"s":17,"'":18})";
    std::ofstream(dir / "merges.txt")
        << "#version: 0.2\nh e\nl l\nhe ll\nhell o\n\xc4\xa0 w\no r\n\xc4\xa0w or\n' s\n";
  }
  train::Gpt2Tokenizer tok((dir / "vocab.json").string(), (dir / "merges.txt").string());
  REQUIRE(tok.vocabSize() == 19);
  auto ids = tok.encode("hello world!");
  REQUIRE(ids == std::vector<int32_t>{11, 14, 2, 7, 15});
  REQUIRE(tok.decode(ids) == "hello world!");
  REQUIRE(tok.encode("hello's") == std::vector<int32_t>{11, 16});
  REQUIRE(tok.decode(tok.encode("he  wow")) == "he  wow");
  REQUIRE_THROWS_AS(tok.encode("xyz"), Error);  // not in this tiny vocabulary
  REQUIRE_THROWS_AS(train::Gpt2Tokenizer((dir / "missing.json").string(), (dir / "merges.txt").string()),
                    Error);
}
