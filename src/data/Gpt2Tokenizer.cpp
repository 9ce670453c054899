// GPT-2 byte-level BPE.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/core/Checksum.h"
#include "strata/data/Data.h"

namespace strata::data {

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else if (cp < 0x800) {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(char(0xE0 | (cp >> 12)));
    s.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Splits a UTF-8 string into its characters.
std::vector<std::string> utf8Chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// ASCII classes, spelled out rather than <cctype>'s, whose answers for bytes >= 0x80 follow the C locale:
// the tokens of a text must not depend on the process's locale.
bool isLetter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
bool isDigit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool isSpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');  // space \t \n \v \f \r
}

// GPT-2's pre-tokenization pattern with ASCII classes:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Calls emit(word) for each pre-token, left to right.
template <class Emit>
void preTokenize(std::string_view text, Emit&& emit) {
  size_t i = 0, n = text.size();
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    if (text[i] == '\'') {
      bool matched = false;
      for (std::string_view c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
        if (text.substr(i, c.size()) == c) {
          emit(text.substr(i, c.size()));
          i += c.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    size_t start = i;
    size_t j = (text[i] == ' ' && i + 1 < n && !isSpace(at(i + 1))) ? i + 1 : i;
    if (j < n && isLetter(at(j))) {
      while (j < n && isLetter(at(j))) ++j;
    } else if (j < n && isDigit(at(j))) {
      while (j < n && isDigit(at(j))) ++j;
    } else if (j < n && !isSpace(at(j))) {
      while (j < n && !isSpace(at(j)) && !isLetter(at(j)) && !isDigit(at(j))) ++j;
    } else {
      // Whitespace. \s+(?!\S): a run followed by a non-space gives up its last character. A ' ' then leads
      // the next word; any other character (the second '\n' of "\n\nHello") is a pre-token of its own (\s+).
      // A run at the end of the text is taken whole.
      while (j < n && isSpace(at(j))) ++j;
      if (j < n && j - start > 1) --j;
    }
    emit(text.substr(start, j - start));
    i = j;
  }
}

std::string readWholeFile(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  STRATA_USER_CHECK(in.good(), "{} {} cannot be read", key, path);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string hex8(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

uint64_t pairKey(int32_t left, int32_t right) {
  return uint64_t(uint32_t(left)) << 32 | uint32_t(right);
}

}  // namespace

int32_t Gpt2Tokenizer::intern(const std::string& symbol) {
  auto [it, added] = symbolIndex_.emplace(symbol, int32_t(symbols_.size()));
  if (added) symbols_.push_back(symbol);
  return it->second;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocabJsonPath, const std::string& mergesPath) {
  // GPT-2's reversible byte -> printable unicode map.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string symbol = utf8(cp);
    symbolToByte_[symbol] = uint8_t(b);
    byteSymbol_[b] = intern(symbol);
  }
  std::string vocabText = readWholeFile(vocabJsonPath, "data.vocab_file");
  std::string mergesText = readWholeFile(mergesPath, "data.merges_file");
  identity_ = "gpt2:" + hex8(crc32c(vocabText.data(), vocabText.size())) + ":" +
              hex8(crc32c(mergesText.data(), mergesText.size()));
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocabText);
  } catch (const std::exception& e) {
    STRATA_USER_FAIL("data.vocab_file {} is not valid JSON: {}", vocabJsonPath, e.what());
  }
  STRATA_USER_CHECK(vocab.is_object(), "data.vocab_file {} is not a JSON object of token -> id",
                    vocabJsonPath);
  std::unordered_map<std::string, int32_t> tokenToId;
  for (auto& [token, id] : vocab.items()) {
    STRATA_USER_CHECK(
        id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t(1) << 30),
        "data.vocab_file {}: token '{}' has id {}, not an integer in [0, 2^30)", vocabJsonPath, token,
        id.dump());
    auto i = id.get<int32_t>();
    tokenToId[token] = i;
    if (size_t(i) >= idToToken_.size()) idToToken_.resize(size_t(i) + 1);
    idToToken_[size_t(i)] = token;
  }
  std::istringstream mergeLines(mergesText);
  std::string line;
  int32_t rank = 0;
  while (std::getline(mergeLines, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    auto space = line.find(' ');
    STRATA_USER_CHECK(space != std::string::npos, "data.merges_file {}: bad line '{}'", mergesPath, line);
    std::string left = line.substr(0, space), right = line.substr(space + 1);
    int32_t a = intern(left), b = intern(right), merged = intern(left + right);
    // A repeated pair keeps its last rank, as HF's dict(zip(merges, range(len(merges)))) does.
    merges_[pairKey(a, b)] = Merge{rank++, merged};
  }
  symbolToId_.assign(symbols_.size(), -1);
  for (size_t s = 0; s < symbols_.size(); ++s) {
    auto it = tokenToId.find(symbols_[s]);
    if (it != tokenToId.end()) symbolToId_[s] = it->second;
  }
}

void Gpt2Tokenizer::bpe(std::string_view word, std::vector<int32_t>& ids) const {
  std::vector<int32_t> parts;
  parts.reserve(word.size());
  for (unsigned char c : word) parts.push_back(byteSymbol_[c]);
  while (parts.size() > 1) {
    const Merge* best = nullptr;
    int32_t left = 0, right = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = merges_.find(pairKey(parts[i], parts[i + 1]));
      if (it != merges_.end() && (!best || it->second.rank < best->rank)) {
        best = &it->second;
        left = parts[i];
        right = parts[i + 1];
      }
    }
    if (!best) break;
    // Merge every occurrence of the best pair, left to right.
    size_t out = 0;
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == left && parts[i + 1] == right) {
        parts[out++] = best->merged;
        i += 2;
      } else {
        parts[out++] = parts[i++];
      }
    }
    parts.resize(out);
  }
  for (int32_t symbol : parts) {
    int32_t id = symbolToId_[size_t(symbol)];
    STRATA_CHECK(id >= 0, "gpt2 tokenizer: piece '{}' is not in the vocabulary", symbols_[size_t(symbol)]);
    ids.push_back(id);
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // Words repeat, so each distinct word's ids are kept for the rest of this call. The cache is local: calls
  // from several threads share nothing mutable.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;  // word -> range in wordIds
  std::vector<int32_t> wordIds;
  preTokenize(text, [&](std::string_view word) {
    auto it = seen.find(word);
    if (it == seen.end()) {
      size_t begin = wordIds.size();
      bpe(word, wordIds);
      it = seen.emplace(word, std::make_pair(begin, wordIds.size())).first;
    }
    ids.insert(ids.end(), wordIds.begin() + std::ptrdiff_t(it->second.first),
               wordIds.begin() + std::ptrdiff_t(it->second.second));
  });
  return ids;
}

// NOTE [Pre-token split points]
// encode(a + b) == encode(a) + encode(b) when the cut between a and b is a pre-token boundary that neither
// side's pre-tokenization can see past; BPE then works on the same words either way. A cut at pos qualifies
// when text[pos] is one whitespace character with non-whitespace on both sides:
// - The pre-token holding text[pos-1] is not whitespace, and such pre-tokens hold no whitespace except a
//   leading ' ', so it ends at pos. What ended it (a run stopped by a whitespace byte, a contraction, a ' '
//   looking one byte ahead from pos-1 or earlier) reads nothing past pos and decides alike on `a` alone.
// - At pos the scan restarts with no state, and from pos on it never looks back. text[pos] followed by a
//   non-space is a one-byte whitespace pre-token, or a ' ' that leads the next word; either way the scan
//   reads the same bytes in `b`.
// Inside a whitespace run there is no such cut: "\n\nHello" pre-tokenizes as "\n", "\n", "Hello", but "\n\n"
// alone is one pre-token. A whitespace byte is ASCII, so the cut never falls inside a UTF-8 character.
bool Gpt2Tokenizer::encodeSplitsAt(std::string_view text, size_t pos) const {
  if (pos == 0 || pos >= text.size()) return true;
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  return pos + 1 < text.size() && isSpace(at(pos)) && !isSpace(at(pos - 1)) && !isSpace(at(pos + 1));
}

std::string Gpt2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    STRATA_CHECK(id >= 0 && size_t(id) < idToToken_.size(), "gpt2 tokenizer: id {} out of range", id);
    for (const auto& ch : utf8Chars(idToToken_[size_t(id)])) {
      auto it = symbolToByte_.find(ch);
      if (it != symbolToByte_.end()) out.push_back(char(it->second));
    }
  }
  return out;
}

}  // namespace strata::data
