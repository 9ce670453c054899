// A small GPT-2-format vocab.json and merges.txt for tests: the 256 byte symbols (so any text encodes) plus
// the merges that build a few words, whitespace runs and a contraction, as GPT-2's files would.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::test {

// GPT-2's byte -> symbol map (bytes_to_unicode), each symbol as UTF-8.
inline std::vector<std::string> gpt2ByteSymbols() {
  std::vector<std::string> symbols;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + extra++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    symbols.push_back(s);
  }
  return symbols;
}

// Writes dir/vocab.json and dir/merges.txt; returns their paths. `words` are byte strings; each gets the
// merges that build it left to right, in order (so " the" comes before "the": its merges must rank first
// to make it one token). `extraIds` adds (token, id) entries to the vocabulary.
inline std::pair<std::string, std::string> writeTinyGpt2Vocab(
    const std::filesystem::path& dir,
    std::vector<std::string> words = {" the", "the", " and", "and", " in", "ing", "'s", "\n\n", "  ", "12",
                                      " 1", "\xc3\xa9", "hello", " world", ".\n", "!!"},
    const std::vector<std::pair<std::string, int>>& extraIds = {}) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> bytes = gpt2ByteSymbols();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[bytes[size_t(b)]] = b;
  int next = 256;
  std::string merges = "#version: 0.2\n";
  for (const auto& word : words) {
    std::string built = bytes[static_cast<unsigned char>(word[0])];
    for (size_t i = 1; i < word.size(); ++i) {
      const std::string& symbol = bytes[static_cast<unsigned char>(word[i])];
      merges += built + " " + symbol + "\n";
      built += symbol;
      if (!vocab.contains(built)) vocab[built] = next++;
    }
  }
  for (const auto& [token, id] : extraIds) vocab[token] = id;
  std::string vocabPath = (dir / "vocab.json").string(), mergesPath = (dir / "merges.txt").string();
  std::ofstream(vocabPath) << vocab.dump();
  std::ofstream(mergesPath) << merges;
  return {vocabPath, mergesPath};
}

}  // namespace strata::test
