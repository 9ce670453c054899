#include "strata/data/SentencePieceTokenizer.h"

#include <fmt/format.h>

#include <fstream>
#include <iterator>

#include "strata/core/Checksum.h"
#include "strata/core/Error.h"

#if STRATA_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace strata::data {

bool sentencePieceAvailable() {
  return STRATA_HAVE_SENTENCEPIECE != 0;
}

#if STRATA_HAVE_SENTENCEPIECE

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& modelPath)
    : impl_(std::make_unique<Impl>()) {
  std::ifstream in(modelPath, std::ios::binary);
  STRATA_USER_CHECK(in.good(), "cannot open the SentencePiece model {}", modelPath);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto status = impl_->processor.LoadFromSerializedProto(bytes);
  STRATA_USER_CHECK(status.ok(), "{} is not a SentencePiece model: {}", modelPath, status.ToString());
  identity_ = fmt::format("sentencepiece:{:08x}", crc32c(bytes.data(), bytes.size()));
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto status = impl_->processor.Encode(text, &ids);
  STRATA_CHECK(status.ok(), "SentencePiece could not encode the text: {}", status.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> in(ids.begin(), ids.end());
  int64_t n = vocabSize();
  for (int id : in)
    STRATA_CHECK(id >= 0 && id < n, "SentencePiece: id {} is outside the vocabulary of {}", id, n);
  std::string text;
  auto status = impl_->processor.Decode(in, &text);
  STRATA_CHECK(status.ok(), "SentencePiece could not decode: {}", status.ToString());
  return text;
}

int64_t SentencePieceTokenizer::vocabSize() const {
  return impl_->processor.GetPieceSize();
}

std::string SentencePieceTokenizer::piece(int32_t id) const {
  STRATA_CHECK(id >= 0 && id < vocabSize(), "SentencePiece: id {} is outside the vocabulary", id);
  return impl_->processor.IdToPiece(id);
}

int32_t SentencePieceTokenizer::unkId() const {
  return impl_->processor.unk_id();
}
int32_t SentencePieceTokenizer::bosId() const {
  return impl_->processor.bos_id();
}
int32_t SentencePieceTokenizer::eosId() const {
  return impl_->processor.eos_id();
}
int32_t SentencePieceTokenizer::padId() const {
  return impl_->processor.pad_id();
}

#else

struct SentencePieceTokenizer::Impl {};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& modelPath) {
  STRATA_USER_FAIL(
      "cannot load the SentencePiece model {}: this build of Strata has no SentencePiece (install Debian's "
      "libsentencepiece-dev, e.g. with tools/setup.sh, and rebuild)",
      modelPath);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

// Unreachable: the constructor always throws without the library.
std::vector<int32_t> SentencePieceTokenizer::encode(const std::string&) const {
  STRATA_FAIL("no SentencePiece in this build");
}
std::string SentencePieceTokenizer::decode(const std::vector<int32_t>&) const {
  STRATA_FAIL("no SentencePiece in this build");
}
int64_t SentencePieceTokenizer::vocabSize() const {
  STRATA_FAIL("no SentencePiece in this build");
}
std::string SentencePieceTokenizer::piece(int32_t) const {
  STRATA_FAIL("no SentencePiece in this build");
}
int32_t SentencePieceTokenizer::unkId() const {
  STRATA_FAIL("no SentencePiece in this build");
}
int32_t SentencePieceTokenizer::bosId() const {
  STRATA_FAIL("no SentencePiece in this build");
}
int32_t SentencePieceTokenizer::eosId() const {
  STRATA_FAIL("no SentencePiece in this build");
}
int32_t SentencePieceTokenizer::padId() const {
  STRATA_FAIL("no SentencePiece in this build");
}

#endif

}  // namespace strata::data
