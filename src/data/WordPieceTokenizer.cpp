#include "strata/data/WordPieceTokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "data/UnicodeTables.h"
#include "strata/core/Checksum.h"
#include "strata/core/Error.h"

namespace strata::data {
namespace {

// ---- UTF-8

// Decodes one code point at s[i], advancing i; an invalid byte decodes as U+FFFD (which cleaning drops).
char32_t nextCodePoint(const std::string& s, size_t& i) {
  auto b = uint8_t(s[i]);
  int extra = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
  if (extra < 0 || i + size_t(extra) >= s.size() + (extra == 0 ? 1 : 0)) {
    ++i;
    return 0xFFFD;
  }
  char32_t cp = extra == 0 ? b : char32_t(b & (0x3F >> extra));
  for (int k = 1; k <= extra; ++k) {
    auto c = uint8_t(s[i + size_t(k)]);
    if ((c >> 6) != 2) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  i += size_t(extra) + 1;
  return cp;
}

void appendUtf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// ---- character classes (HF's _is_whitespace, _is_control, _is_punctuation, _is_chinese_char)

template <size_t N>
bool inRanges(const unicode::CodeRange (&table)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(table), std::end(table), c,
                             [](char32_t v, const unicode::CodeRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

bool isWhitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || inRanges(unicode::kSpaceSeparator, c);
}

bool isControl(char32_t c) {
  return c != '\t' && c != '\n' && c != '\r' && inRanges(unicode::kControl, c);
}

bool isPunctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
    return true;  // every non-alphanumeric ASCII symbol counts, as in HF
  return inRanges(unicode::kPunctuation, c);
}

bool isCjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// HF lower-cases a word and then strips accents (NFD, drop category Mn); per character that is the table's
// mapping (or the character itself), with marks dropped.
void appendNormalized(std::string& out, char32_t c, bool lower) {
  if (!lower) {
    appendUtf8(out, c);
    return;
  }
  if (c < 0x80) {
    out += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  if (inRanges(unicode::kNonspacingMark, c)) return;
  if (c >= 0xAC00 && c <= 0xD7A3) {
    // A Hangul syllable's NFD is its conjoining jamo, by arithmetic (Unicode's 3.12), not by table.
    uint32_t s = uint32_t(c - 0xAC00);
    appendUtf8(out, char32_t(0x1100 + s / 588));
    appendUtf8(out, char32_t(0x1161 + (s % 588) / 28));
    if (s % 28 != 0) appendUtf8(out, char32_t(0x11A7 + s % 28));
    return;
  }
  auto it = std::lower_bound(std::begin(unicode::kLowerStrip), std::end(unicode::kLowerStrip), c,
                             [](const unicode::LowerStrip& e, char32_t v) { return e.cp < v; });
  if (it != std::end(unicode::kLowerStrip) && it->cp == c) {
    out += it->utf8;
    return;
  }
  appendUtf8(out, c);
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(const std::string& vocabPath, const WordPieceOptions& options)
    : WordPieceTokenizer(
          [&] {
            std::ifstream in(vocabPath);
            STRATA_USER_CHECK(in.good(), "cannot read the WordPiece vocabulary '{}'", vocabPath);
            std::vector<std::string> vocab;
            std::string line;
            while (std::getline(in, line)) {
              if (!line.empty() && line.back() == '\r') line.pop_back();
              vocab.push_back(line);
            }
            STRATA_USER_CHECK(!vocab.empty(), "the WordPiece vocabulary '{}' is empty", vocabPath);
            return vocab;
          }(),
          options) {}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, const WordPieceOptions& options)
    : options_(options), tokens_(std::move(vocab)) {
  std::string all;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    ids_.emplace(tokens_[i], int32_t(i));  // a duplicate keeps its first id
    all += tokens_[i];
    all += '\n';
  }
  unkId_ = tokenId(options.unkToken);
  STRATA_USER_CHECK(unkId_ >= 0, "the WordPiece vocabulary has no unknown token '{}'", options.unkToken);
  STRATA_USER_CHECK(options.maxCharsPerWord > 0, "WordPiece: maxCharsPerWord must be positive");
  identity_ = "wordpiece2:" + hex8(crc32c(all.data(), all.size())) + ":" +
              (options.lowerCase ? "lower" : "cased") + ":" + std::to_string(options.maxCharsPerWord);
}

int32_t WordPieceTokenizer::tokenId(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::string> WordPieceTokenizer::basicTokens(const std::string& text) const {
  std::vector<std::string> words;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  for (size_t i = 0; i < text.size();) {
    char32_t c = nextCodePoint(text, i);
    if (c == 0 || c == 0xFFFD || isControl(c)) continue;
    if (isWhitespace(c)) {
      flush();
    } else if (isCjk(c)) {
      // A word of its own (HF spaces CJK ideographs out before anything else), normalised as every word is
      // (a CJK compatibility ideograph becomes the unified one).
      flush();
      appendNormalized(word, c, options_.lowerCase);
      flush();
    } else if (c < 0x80) {
      if (isPunctuation(c)) {
        flush();
        word += char(c);
        flush();
      } else {
        appendNormalized(word, c, options_.lowerCase);
      }
    } else {
      // HF splits off punctuation after lower-casing and stripping accents, so what the character becomes
      // decides: U+037E becomes ';' and U+2260 '=' (its stroke is a combining mark), each a word of its own.
      std::string normalized;
      appendNormalized(normalized, c, options_.lowerCase);
      for (size_t k = 0; k < normalized.size();) {
        char32_t n = nextCodePoint(normalized, k);
        if (isPunctuation(n)) {
          flush();
          appendUtf8(word, n);
          flush();
        } else {
          appendUtf8(word, n);
        }
      }
    }
  }
  flush();
  return words;
}

void WordPieceTokenizer::wordPiece(const std::string& word, std::vector<int32_t>& ids) const {
  // Character boundaries (code points), for the length limit and for the pieces' ends.
  std::vector<size_t> bounds;
  for (size_t i = 0; i < word.size();) {
    bounds.push_back(i);
    nextCodePoint(word, i);
  }
  bounds.push_back(word.size());
  size_t chars = bounds.size() - 1;
  if (chars > size_t(options_.maxCharsPerWord)) {
    ids.push_back(unkId_);
    return;
  }
  std::vector<int32_t> pieces;
  size_t start = 0;
  std::string candidate;
  while (start < chars) {
    int32_t found = -1;
    size_t end = chars;
    for (; end > start; --end) {
      candidate = start > 0 ? "##" : "";
      candidate.append(word, bounds[start], bounds[end] - bounds[start]);
      found = tokenId(candidate);
      if (found >= 0) break;
    }
    if (found < 0) {
      ids.push_back(unkId_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  ids.insert(ids.end(), pieces.begin(), pieces.end());
}

std::vector<int32_t> WordPieceTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& word : basicTokens(text)) wordPiece(word, ids);
  return ids;
}

std::string WordPieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    STRATA_CHECK(id >= 0 && size_t(id) < tokens_.size(),
                 "WordPiece decode: id {} is outside the vocabulary of {}", id, tokens_.size());
    const std::string& t = tokens_[size_t(id)];
    if (t.rfind("##", 0) == 0 && !out.empty()) {
      out.append(t, 2);
    } else {
      if (!out.empty()) out += ' ';
      out += t;
    }
  }
  return out;
}

bool WordPieceTokenizer::encodeSplitsAt(std::string_view text, size_t pos) const {
  if (pos == 0 || pos >= text.size()) return true;
  char c = text[pos];
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

}  // namespace strata::data
