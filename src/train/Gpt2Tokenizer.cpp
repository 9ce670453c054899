// GPT-2 byte-level BPE.
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "strata/train/Data.h"

namespace strata::train {

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

bool isLetter(unsigned char c) {
  return std::isalpha(c) || c >= 0x80;
}
bool isDigit(unsigned char c) {
  return std::isdigit(c);
}
bool isSpace(unsigned char c) {
  return std::isspace(c);
}

// GPT-2's pre-tokenization pattern with ASCII classes.
std::vector<std::string> preTokenize(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0, n = text.size();
  auto at = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < n) {
    if (text[i] == '\'') {
      bool matched = false;
      for (const char* c : {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"}) {
        size_t len = std::strlen(c);
        if (text.compare(i, len, c) == 0) {
          words.push_back(text.substr(i, len));
          i += len;
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
      // Whitespace: leave one space to lead the next word when a word follows (\s+(?!\S)).
      while (j < n && isSpace(at(j))) ++j;
      if (j < n && j - start > 1 && text[j - 1] == ' ') --j;
    }
    words.push_back(text.substr(start, j - start));
    i = j;
  }
  return words;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocabJsonPath, const std::string& mergesPath) {
  // GPT-2's reversible byte -> printable unicode map.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    byteToSymbol_[b] = utf8(cp);
    symbolToByte_[byteToSymbol_[b]] = uint8_t(b);
  }
  std::ifstream vin(vocabJsonPath);
  STRATA_CHECK(vin.good(), "data.vocab_file {} cannot be read", vocabJsonPath);
  nlohmann::json vocab;
  try {
    vin >> vocab;
  } catch (const std::exception& e) {
    STRATA_FAIL("data.vocab_file {} is not valid JSON: {}", vocabJsonPath, e.what());
  }
  for (auto& [token, id] : vocab.items()) {
    int32_t i = id.get<int32_t>();
    tokenToId_[token] = i;
    if (size_t(i) >= idToToken_.size()) idToToken_.resize(size_t(i) + 1);
    idToToken_[size_t(i)] = token;
  }
  std::ifstream min(mergesPath);
  STRATA_CHECK(min.good(), "data.merges_file {} cannot be read", mergesPath);
  std::string line;
  int rank = 0;
  while (std::getline(min, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    auto space = line.find(' ');
    STRATA_CHECK(space != std::string::npos, "data.merges_file {}: bad line '{}'", mergesPath, line);
    mergeRank_[{line.substr(0, space), line.substr(space + 1)}] = rank++;
  }
}

std::vector<std::string> Gpt2Tokenizer::bpe(const std::string& word) const {
  std::vector<std::string> parts;
  for (unsigned char c : word) parts.push_back(byteToSymbol_[c]);
  while (parts.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = mergeRank_.find({parts[i], parts[i + 1]});
      if (it != mergeRank_.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    // Merge every occurrence of the best pair, left to right.
    std::string a = parts[at], b = parts[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
        merged.push_back(a + b);
        i += 2;
      } else {
        merged.push_back(parts[i++]);
      }
    }
    parts = std::move(merged);
  }
  return parts;
}

std::vector<int32_t> Gpt2Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const auto& word : preTokenize(text)) {
    for (const auto& piece : bpe(word)) {
      auto it = tokenToId_.find(piece);
      STRATA_CHECK(it != tokenToId_.end(), "gpt2 tokenizer: piece '{}' is not in the vocabulary", piece);
      ids.push_back(it->second);
    }
  }
  return ids;
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

}  // namespace strata::train
