#include <filesystem>
#include <fstream>

#include "TestUtil.h"
#include "strata/data/WordPieceTokenizer.h"

using namespace strata;
using namespace strata::data;

namespace {
std::vector<std::string> vocab() {
  return {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "un",   "##aff", "##able", "hello",
          "world", ",",     "!",     "cafe",  "naive",  "a",   "##b",  "##c",   "中",     "国",
          "'",     "s",     "##s",   "run",   "##ning", ".",   "über", "uber"};
}
std::vector<std::string> tokens(const WordPieceTokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (int32_t id : t.encode(text)) out.push_back(t.token(id));
  return out;
}
using Toks = std::vector<std::string>;
}  // namespace

TEST_CASE("WordPiece: greedy longest match with ## pieces, [UNK] for unpieceable words",
          "[train][wordpiece]") {
  WordPieceTokenizer t(vocab());
  REQUIRE(tokens(t, "unaffable") == Toks{"un", "##aff", "##able"});
  REQUIRE(tokens(t, "Hello, World!") == Toks{"hello", ",", "world", "!"});
  REQUIRE(tokens(t, "running runs") == Toks{"run", "##ning", "run", "##s"});
  REQUIRE(tokens(t, "unbelievable") == Toks{"[UNK]"});  // "un" then no piece for "##believable"
  REQUIRE(tokens(t, "abc abcd") == Toks{"a", "##b", "##c", "[UNK]"});
  REQUIRE(t.encode("the") == std::vector<int32_t>{5});
  REQUIRE(t.decode(t.encode("unaffable, the world!")) == "unaffable , the world !");
  REQUIRE(t.vocabSize() == int64_t(vocab().size()));
}

TEST_CASE("WordPiece basic tokenizer: lower-case, accents, punctuation, CJK, controls",
          "[train][wordpiece]") {
  WordPieceTokenizer t(vocab());
  // Accents stripped after lower-casing: Café -> cafe, NAÏVE -> naive; ü -> u.
  REQUIRE(tokens(t, "Café NAÏVE Über") == Toks{"cafe", "naive", "uber"});
  // Already-decomposed input: e + U+0301 loses its mark.
  REQUIRE(tokens(t, "cafe\xcc\x81") == Toks{"cafe"});
  // Each CJK ideograph is a word; punctuation splits words (the apostrophe too).
  REQUIRE(tokens(t, "中国the") == Toks{"中", "国", "the"});
  REQUIRE(tokens(t, "the's") == Toks{"the", "'", "s"});
  // Controls vanish, unicode spaces split (NBSP, ideographic space), tabs and newlines are spaces.
  REQUIRE(t.basicTokens("the\x01world\xc2\xa0hello\tthe\n\xe3\x80\x80world") ==
          Toks{"theworld", "hello", "the", "world"});
  // General punctuation (an em dash, curly quotes) splits like ASCII punctuation.
  REQUIRE(t.basicTokens("a\xe2\x80\x94"
                        "b \xe2\x80\x9chello\xe2\x80\x9d") ==
          Toks{"a", "\xe2\x80\x94", "b", "\xe2\x80\x9c", "hello", "\xe2\x80\x9d"});
  // Greek and Cyrillic lower-case and lose their marks: Ά -> α, Й -> и.
  REQUIRE(t.basicTokens("\xce\x86\xce\x92 \xd0\x99\xd0\x90") == Toks{"\xce\xb1\xce\xb2", "\xd0\xb8\xd0\xb0"});
  // Beyond U+1FFF, as Python's NFD: kana lose their dakuten (de su -> te su), a Hangul syllable becomes its
  // jamo, a CJK compatibility ideograph the unified one, and circled and Roman-numeral letters lower-case.
  REQUIRE(t.basicTokens("\xe3\x81\xa7\xe3\x81\x99") == Toks{"\xe3\x81\xa6\xe3\x81\x99"});
  REQUIRE(t.basicTokens("\xed\x95\x9c") == Toks{"\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab"});
  REQUIRE(t.basicTokens("\xef\xa4\x80") == Toks{"\xe8\xb1\x88"});
  REQUIRE(t.basicTokens("a\xcd\xbe") == Toks{"a", ";"});  // U+037E, Greek question mark: NFD ';'
  // Punctuation is split off after normalising: U+2260 (not equal) loses its stroke, a combining mark.
  REQUIRE(t.basicTokens("a\xe2\x89\xa0"
                        "b") == Toks{"a", "=", "b"});
  REQUIRE(t.basicTokens("\xe2\x85\xab\xe2\x92\xb6") == Toks{"\xe2\x85\xbb\xe2\x93\x90"});
  // Cased: nothing is lower-cased or stripped.
  WordPieceOptions cased;
  cased.lowerCase = false;
  WordPieceTokenizer c(vocab(), cased);
  REQUIRE(c.basicTokens("Café Hello") == Toks{"Café", "Hello"});
  REQUIRE(tokens(c, "über") == Toks{"über"});
}

TEST_CASE("WordPiece: words over max chars become [UNK]; vocab files; identity", "[train][wordpiece]") {
  WordPieceTokenizer t(vocab());
  std::string longWord(100, 'a'), tooLong(101, 'a');
  REQUIRE(tokens(t, tooLong) == Toks{"[UNK]"});
  REQUIRE(tokens(t, longWord) == Toks{"[UNK]"});  // not pieceable ("##a" is missing) but within the limit
  auto dir = test::freshDir("strata_wordpiece");
  {
    std::ofstream out(dir / "vocab.txt");
    for (const std::string& v : vocab()) out << v << "\r\n";  // CRLF lines are read too
  }
  WordPieceTokenizer fromFile((dir / "vocab.txt").string());
  REQUIRE(fromFile.encode("Hello, unaffable world!") == t.encode("Hello, unaffable world!"));
  REQUIRE(fromFile.identity() == t.identity());
  WordPieceOptions cased;
  cased.lowerCase = false;
  REQUIRE(WordPieceTokenizer(vocab(), cased).identity() != t.identity());
  REQUIRE(test::errorOf([&] { WordPieceTokenizer((dir / "missing.txt").string()); }).find("missing.txt") !=
          std::string::npos);
  REQUIRE(test::errorOf([&] {
            WordPieceTokenizer(std::vector<std::string>{"a", "b"});
          }).find("[UNK]") != std::string::npos);
  // Splitting at whitespace gives the same ids as the whole text.
  std::string text = "Hello, world! the unaffable cafe";
  for (size_t pos = 0; pos <= text.size(); ++pos) {
    if (!t.encodeSplitsAt(text, pos)) continue;
    std::vector<int32_t> a = t.encode(text.substr(0, pos)), b = t.encode(text.substr(pos));
    a.insert(a.end(), b.begin(), b.end());
    REQUIRE(a == t.encode(text));
  }
}
