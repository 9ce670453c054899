// SentencePiece tokenizers (T5's spiece.model, and any other `.model` file) through Debian's
// libsentencepiece-dev, found at build time. A build without the library still compiles: loading a model
// then fails with an error that says how to get it (sentencePieceAvailable() tells beforehand).
//
// encode gives the model's piece ids as SentencePieceProcessor::Encode does (HF's T5Tokenizer gives the
// same ids, plus the </s> it appends when add_special_tokens is on); decode joins pieces back into text.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/data/Data.h"

namespace strata::data {

// True when this build links libsentencepiece.
bool sentencePieceAvailable();

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads a serialized SentencePiece model (a `.model` file). Throws a user error naming the file when it
  // is missing or not a model, or when this build has no SentencePiece.
  explicit SentencePieceTokenizer(const std::string& modelPath);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocabSize() const override;
  // "sentencepiece:<CRC32C of the model file>".
  std::string identity() const override { return identity_; }

  // The piece of `id` (e.g. "▁the"), and the special ids (-1 when the model has none).
  std::string piece(int32_t id) const;
  int32_t unkId() const;
  int32_t bosId() const;
  int32_t eosId() const;
  int32_t padId() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string identity_;
};

}  // namespace strata::data
