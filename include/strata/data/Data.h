// Tokenizers and token datasets.
//
// - ByteTokenizer: one token per byte (vocab 256); any text round-trips.
// - Raw text is tokenized once and cached as a nanoGPT-style headerless uint16 .bin in the run's cache
//   directory, keyed by the file's path, size, mtime and CRC32C and the tokenizer's identity (NOTE [Token
//   cache] in Data.cpp).
// - nanoGPT .bin (headerless uint16) and Megatron .bin/.idx (the .idx says the token dtype) are
// memory-mapped.
// - Batches are windows at offsets drawn from Philox(seed, batch index): the same config and seed give the
// same
//   batches on every machine, and a run resumed at batch k continues exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocabSize() const = 0;
  // What decides encode's output: the kind of tokenizer and a hash of its files. Token caches are keyed by
  // it, so two tokenizers with one identity must encode every text alike.
  virtual std::string identity() const = 0;
  // True when encode(text[0, pos)) followed by encode(text[pos, end)) equals encode(text), judged from the
  // bytes near pos. tokenizeFile cuts big inputs there to encode the pieces in parallel. The default only
  // allows the trivial cuts, which keeps any tokenizer correct (and serial).
  virtual bool encodeSplitsAt(std::string_view text, size_t pos) const {
    return pos == 0 || pos >= text.size();
  }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocabSize() const override { return 256; }
  std::string identity() const override { return "byte"; }
  bool encodeSplitsAt(std::string_view, size_t) const override { return true; }
};

// GPT-2's byte-level BPE from its vocab.json and merges.txt. Pre-tokenization follows GPT-2's pattern
// ('s 't 're 've 'm 'll 'd, letters, digits, other symbols, whitespace) with ASCII character classes; bytes
// >= 0x80 count as letters, so UTF-8 words stay whole. encode is safe to call from several threads.
class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& vocabJsonPath, const std::string& mergesPath);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocabSize() const override { return int64_t(idToToken_.size()); }
  // "gpt2:<CRC32C of vocab.json>:<CRC32C of merges.txt>" in hex.
  std::string identity() const override { return identity_; }
  bool encodeSplitsAt(std::string_view text, size_t pos) const override;

 private:
  // BPE runs on interned symbols: every string a merge reads or makes, and each byte's symbol, has an index.
  struct Merge {
    int32_t rank;
    int32_t merged;  // the symbol the pair becomes
  };
  int32_t intern(const std::string& symbol);
  void bpe(std::string_view word, std::vector<int32_t>& ids) const;  // appends the word's token ids

  std::vector<std::string> idToToken_;
  std::map<std::string, uint8_t> symbolToByte_;
  int32_t byteSymbol_[256] = {};
  std::unordered_map<std::string, int32_t> symbolIndex_;
  std::vector<std::string> symbols_;
  std::vector<int32_t> symbolToId_;             // -1: not in the vocabulary
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank and result
  std::string identity_;
};

enum class Split { Train, Val };

class TokenDataset {
 public:
  // Opens `path` in `format` ("text", "nanogpt", "megatron"). Text is tokenized with `tokenizer` and cached
  // in `cacheDir`. valFraction of the tokens (the tail) form the validation split.
  static TokenDataset open(const std::string& path, const std::string& format, const Tokenizer& tokenizer,
                           const std::string& cacheDir, double valFraction);
  // Wraps tokens already in memory (tests, custom pipelines).
  static TokenDataset fromTokens(std::vector<uint16_t> tokens, double valFraction);
  // `numTokens` uniform ids in [0, vocabSize) from Philox(seed) (data.format: random): speed runs need no
  // corpus. vocabSize <= 65536.
  static TokenDataset random(int64_t vocabSize, int64_t numTokens, uint64_t seed, double valFraction);

  int64_t size() const { return numTokens_; }
  int64_t splitSize(Split s) const;
  int64_t token(int64_t i) const;
  // The largest token id (validated against the model's vocabulary before training).
  int64_t maxToken() const;

  // Batch number `index` of split `split`: inputs and next-token targets, both i64 [B, T] on `device`.
  std::pair<Tensor, Tensor> batch(Split split, int64_t index, int64_t B, int64_t T, uint64_t seed,
                                  Device device) const;

 private:
  struct Mapping;
  std::shared_ptr<Mapping> mapping_;  // owns the mapped file or the in-memory tokens
  const void* data_ = nullptr;
  int elementBytes_ = 2;
  int64_t numTokens_ = 0;
  int64_t trainTokens_ = 0;
};

}  // namespace strata::data
