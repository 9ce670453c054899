#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "TinyGpt2Vocab.h"
#include "strata/data/Data.h"

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
  data::Gpt2Tokenizer tok((dir / "vocab.json").string(), (dir / "merges.txt").string());
  REQUIRE(tok.vocabSize() == 19);
  auto ids = tok.encode("hello world!");
  REQUIRE(ids == std::vector<int32_t>{11, 14, 2, 7, 15});
  REQUIRE(tok.decode(ids) == "hello world!");
  REQUIRE(tok.encode("hello's") == std::vector<int32_t>{11, 16});
  REQUIRE(tok.decode(tok.encode("he  wow")) == "he  wow");
  REQUIRE_THROWS_AS(tok.encode("xyz"), Error);  // not in this tiny vocabulary
  REQUIRE_THROWS_AS(data::Gpt2Tokenizer((dir / "missing.json").string(), (dir / "merges.txt").string()),
                    Error);
}

TEST_CASE("GPT-2 pre-tokenization gives a whitespace run's last character to what follows",
          "[train][tokenizer]") {
  // \s+(?!\S): "\n\nHello" is "\n", "\n", "Hello" (GPT-2 ids 198 198 15496), while "\n\n" at the end of the
  // text stays one pre-token (628).
  auto [vocab, merges] = test::writeTinyGpt2Vocab(fs::temp_directory_path() / "strata-bpe-ws-test");
  data::Gpt2Tokenizer tok(vocab, merges);
  auto id = [&](const std::string& piece) {
    auto ids = tok.encode(piece);
    REQUIRE(ids.size() == 1);
    return ids[0];
  };
  int32_t nl = id("\n"), nlnl = id("\n\n"), tab = id("\t"), space = id(" "), a = id("a"), b = id("b"),
          the = id("the"), spaceThe = id(" the");
  REQUIRE(nlnl != nl);
  REQUIRE(tok.encode("a\n\nb") == std::vector<int32_t>{a, nl, nl, b});
  REQUIRE(tok.encode("a\n\n") == std::vector<int32_t>{a, nlnl});
  REQUIRE(tok.encode("a\n\n\nb") == std::vector<int32_t>{a, nlnl, nl, b});
  REQUIRE(tok.encode("a \nb") == std::vector<int32_t>{a, space, nl, b});
  REQUIRE(tok.encode("a\n the") == std::vector<int32_t>{a, nl, spaceThe});
  REQUIRE(tok.encode("a \tthe") == std::vector<int32_t>{a, space, tab, the});
  REQUIRE(tok.decode(tok.encode("a \n\n\t the  \n")) == "a \n\n\t the  \n");
}

TEST_CASE("tokenizer identities name the files; GPT-2 splits only where encode does", "[train][tokenizer]") {
  fs::path dir = fs::temp_directory_path() / "strata-bpe-identity-test";
  auto [vocab, merges] = test::writeTinyGpt2Vocab(dir / "one");
  auto [vocab2, merges2] = test::writeTinyGpt2Vocab(dir / "two", {"the", "an"});
  data::Gpt2Tokenizer tok(vocab, merges), same(vocab, merges), other(vocab2, merges2);
  REQUIRE(tok.identity().rfind("gpt2:", 0) == 0);
  REQUIRE(tok.identity() == same.identity());
  REQUIRE(tok.identity() != other.identity());
  REQUIRE(data::ByteTokenizer().identity() == "byte");

  // Every position encodeSplitsAt accepts is a place where encoding the two sides apart changes nothing.
  std::string text =
      "It's 12 o'clock!! The  cat\n\nsat\n \tthere, \xc3\xa9t\xc3\xa9 --  done.\n\n\nEnd 1 2\r\n'll x' 's";
  auto whole = tok.encode(text);
  int splits = 0;
  for (size_t pos = 0; pos <= text.size(); ++pos) {
    if (!tok.encodeSplitsAt(text, pos)) continue;
    ++splits;
    auto left = tok.encode(text.substr(0, pos)), right = tok.encode(text.substr(pos));
    left.insert(left.end(), right.begin(), right.end());
    INFO("split at " << pos);
    REQUIRE(left == whole);
  }
  REQUIRE(splits > 10);
  // Never after a whitespace run that a word follows: "\n\n" alone is one pre-token, but "\n\nsat" is
  // "\n", "\n", "sat".
  size_t afterRun = text.find("\n\nsat") + 2;
  REQUIRE(!tok.encodeSplitsAt(text, afterRun));
  auto left = tok.encode(text.substr(0, afterRun)), right = tok.encode(text.substr(afterRun));
  left.insert(left.end(), right.begin(), right.end());
  REQUIRE(left != whole);
}
