// Tokenizers and token datasets.
//
// - ByteTokenizer: one token per byte (vocab 256); any text round-trips.
// - Raw text is tokenized once and cached as a nanoGPT-style headerless uint16 .bin next to the run's output.
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
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::train {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocabSize() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocabSize() const override { return 256; }
};

// GPT-2's byte-level BPE from its vocab.json and merges.txt. Pre-tokenization follows GPT-2's pattern
// ('s 't 're 've 'm 'll 'd, letters, digits, other symbols, whitespace) with ASCII character classes; bytes
// >= 0x80 count as letters, so UTF-8 words stay whole.
class Gpt2Tokenizer final : public Tokenizer {
 public:
  Gpt2Tokenizer(const std::string& vocabJsonPath, const std::string& mergesPath);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocabSize() const override { return int64_t(idToToken_.size()); }

 private:
  std::vector<std::string> bpe(const std::string& word) const;
  std::map<std::string, int32_t> tokenToId_;
  std::vector<std::string> idToToken_;
  std::map<std::pair<std::string, std::string>, int> mergeRank_;
  std::string byteToSymbol_[256];
  std::map<std::string, uint8_t> symbolToByte_;
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

}  // namespace strata::train
