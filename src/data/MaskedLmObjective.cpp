#include "strata/data/MaskedLmObjective.h"

#include <fmt/format.h>
#include <algorithm>

#include <cmath>

#include "strata/autograd/GradMode.h"
#include "strata/core/Philox.h"
#include "strata/data/WordPieceTokenizer.h"

namespace strata::data {
namespace {

const std::string kMaskText = "[MASK]";

// A token as a quoted string for a listing: control characters and lone high bytes escaped.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && text.size() == 1)) {
      out += fmt::format("\\x{:02x}", int(c));
    } else if (c == '\'') {
      out += "\\'";
    } else {
      out += char(c);
    }
  }
  return out + "'";
}

}  // namespace

MaskedLmObjective::MaskedLmObjective(std::shared_ptr<models::Bert> model,
                                     std::shared_ptr<const Tokenizer> tokenizer, uint64_t seed)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), seed_(seed) {
  STRATA_CHECK(model_ != nullptr, "MaskedLmObjective: no model given");
  int64_t V = model_->vocabSize();
  const auto* wordPiece = dynamic_cast<const WordPieceTokenizer*>(tokenizer_.get());
  if (wordPiece != nullptr) {
    special_ = {wordPiece->tokenId("[PAD]"), wordPiece->tokenId("[CLS]"), wordPiece->tokenId("[SEP]"),
                wordPiece->tokenId("[MASK]")};
    STRATA_USER_CHECK(special_.pad >= 0 && special_.cls >= 0 && special_.sep >= 0 && special_.mask >= 0,
                      "bert: the WordPiece vocabulary lacks one of [PAD], [CLS], [SEP], [MASK]");
    STRATA_USER_CHECK(model_->config().padId() == special_.pad,
                      "bert: the WordPiece vocabulary's [PAD] is {} but the model's is {}: set "
                      "model.pad_token_id to {}",
                      special_.pad, model_->config().padId(), special_.pad);
    STRATA_USER_CHECK(wordPiece->vocabSize() <= V,
                      "bert: the WordPiece vocabulary has {} tokens but model.vocab_size is {}",
                      wordPiece->vocabSize(), V);
    dataVocab_ = wordPiece->vocabSize();
  } else {
    STRATA_USER_CHECK(V > 4, "bert: model.vocab_size ({}) leaves no room below the 4 special tokens", V);
    // [PAD] is the model's (model.pad_token_id; an HF checkpoint's pad_token_id): the id whose word-embedding
    // row takes no gradient from lookups. Its default is V - 4.
    special_ = {model_->config().padId(), V - 3, V - 2, V - 1};
    dataVocab_ = V - 4;
    if (tokenizer_)
      STRATA_USER_CHECK(tokenizer_->vocabSize() <= dataVocab_,
                        "bert: the {} tokenizer has {} tokens, and [PAD] [CLS] [SEP] [MASK] take the last 4 "
                        "ids of model.vocab_size, so it must be at least {} (it is {})",
                        tokenizer_->identity().substr(0, tokenizer_->identity().find(':')),
                        tokenizer_->vocabSize(), tokenizer_->vocabSize() + 4, V);
  }
  masking_.maskTokenId = special_.mask;
  masking_.vocabSize = dataVocab_;  // random replacements are data tokens
  masking_.specialTokenIds = {special_.pad, special_.cls, special_.sep};
  STRATA_USER_CHECK(windowLength() >= 2, "bert: model.seq_length ({}) is too short for its special tokens",
                    model_->contextLength());
}

int64_t MaskedLmObjective::windowLength() const {
  // [CLS] window [SEP], or [CLS] A [SEP] B [SEP].
  return model_->contextLength() - (model_->config().nspHead ? 3 : 2);
}

Tensor MaskedLmObjective::loss(const TokenBatch& batch, DType compute) {
  MlmInputs in = inputs(batch);
  // The MLM head on the chosen tokens only (about 15% of them): the loss of the full form, a fraction of the
  // head's work and no [B, S, vocab] logits.
  if (!model_->config().nspHead)
    return model_->mlmLoss(in.ids, Tensor(), Tensor(), in.positionLabels, compute, in.positions);
  return model_->pretrainingLoss(in.ids, in.tokenTypes, Tensor(), in.positionLabels, in.nspLabels, compute,
                                 in.positions);
}

MlmInputs MaskedLmObjective::inputs(const TokenBatch& batch) const {
  const Tensor& windows = batch.ids;
  STRATA_CHECK(windows.dim() == 2, "bert: a batch of windows must be [batch, tokens], got {}",
               toString(windows.shape()));
  int64_t B = windows.size(0), T = windows.size(1);
  bool nsp = model_->config().nspHead;
  int64_t S = T + (nsp ? 3 : 2);
  std::vector<int64_t> w = windows.to(Device::cpu(), DType::I64).contiguous().toVector<int64_t>();
  std::vector<int64_t> ids, types, nspLabels;
  ids.reserve(size_t(B * S));
  uint64_t key = corruptionSeed(seed_, batch.split);
  int64_t half = T / 2;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t* row = w.data() + b * T;
    ids.push_back(special_.cls);
    if (!nsp) {
      ids.insert(ids.end(), row, row + T);
      ids.push_back(special_.sep);
      continue;
    }
    // Next-sentence pairs: A is the window's first half; B its second half (label 0) or, with probability
    // one half, the second half of another row of the micro-batch (label 1).
    PhiloxOut r = philox4x32(uint64_t(batch.index) * uint64_t(B) + uint64_t(b), ~key);
    bool random = B > 1 && (r.x[0] & 1u);
    int64_t other = random ? (b + 1 + int64_t(r.x[1] % uint32_t(B - 1))) % B : b;
    ids.insert(ids.end(), row, row + half);
    ids.push_back(special_.sep);
    const int64_t* second = w.data() + other * T;
    ids.insert(ids.end(), second + half, second + T);
    ids.push_back(special_.sep);
    types.insert(types.end(), size_t(half + 2), 0);
    types.insert(types.end(), size_t(T - half + 1), 1);
    nspLabels.push_back(random ? 1 : 0);
  }
  Device device = windows.device();
  Tensor sequences = Tensor::fromVector<int64_t>(ids, {B, S}, device);
  MlmBatch masked = mlmMask(sequences, masking_, key, uint64_t(batch.index) * uint64_t(B * S));
  MlmInputs out{masked.inputIds, masked.labels, Tensor(), Tensor(), masked.positions, masked.positionLabels};
  if (nsp) {
    out.tokenTypes = Tensor::fromVector<int64_t>(types, {B, S}, device);
    out.nspLabels = Tensor::fromVector<int64_t>(nspLabels, {B}, device);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> MaskedLmObjective::modelInputs(const TokenBatch& batch) const {
  MlmInputs in = inputs(batch);
  if (!model_->config().nspHead) return {{"input_ids", in.ids}, {"labels", in.labels}};
  return {{"input_ids", in.ids},
          {"token_type_ids", in.tokenTypes},
          {"labels", in.labels},
          {"next_sentence_label", in.nspLabels}};
}

std::vector<std::pair<std::string, Tensor>> MaskedLmObjective::logits(const TokenBatch& batch,
                                                                      DType compute) {
  MlmInputs in = inputs(batch);
  if (!model_->config().nspHead) return {{"logits", model_->mlmLogits(in.ids, Tensor(), Tensor(), compute)}};
  return {{"prediction_logits", model_->mlmLogits(in.ids, in.tokenTypes, Tensor(), compute)},
          {"seq_relationship_logits", model_->nspLogits(in.ids, in.tokenTypes, Tensor(), compute)}};
}

std::string MaskedLmObjective::tokenText(int64_t id) const {
  if (id == special_.pad) return "[PAD]";
  if (id == special_.cls) return "[CLS]";
  if (id == special_.sep) return "[SEP]";
  if (id == special_.mask) return kMaskText;
  if (tokenizer_ && id < tokenizer_->vocabSize()) return tokenizer_->decode({int32_t(id)});
  return detail::format("[{}]", id);
}

std::optional<Generation> MaskedLmObjective::generate(const std::string& prompt, const GenerateOptions& o,
                                                      DType compute) {
  if (prompt.find(kMaskText) == std::string::npos) return std::nullopt;
  STRATA_CHECK(tokenizer_ != nullptr, "MaskedLmObjective: filling masks needs a tokenizer");
  // [CLS] piece [MASK] piece ... [SEP]
  std::vector<int64_t> ids{special_.cls};
  std::vector<size_t> masks;
  size_t from = 0;
  while (true) {
    size_t at = prompt.find(kMaskText, from);
    std::string piece = prompt.substr(from, at == std::string::npos ? std::string::npos : at - from);
    if (!piece.empty())
      for (int32_t id : tokenizer_->encode(piece)) ids.push_back(id);
    if (at == std::string::npos) break;
    masks.push_back(ids.size());
    ids.push_back(special_.mask);
    from = at + kMaskText.size();
  }
  ids.push_back(special_.sep);
  STRATA_USER_CHECK(int64_t(ids.size()) <= model_->contextLength(),
                    "bert: the prompt takes {} tokens with [CLS] and [SEP], more than model.seq_length {}",
                    ids.size(), model_->contextLength());
  NoGradGuard noGrad;
  bool wasTraining = model_->isTraining();
  model_->eval();
  Device device = model_->parameters().front().device();
  Tensor x = Tensor::fromVector<int64_t>(ids, {1, int64_t(ids.size())}, device);
  Tensor logits = model_->mlmLogits(x, Tensor(), Tensor(), compute).to(Device::cpu(), DType::F32);
  model_->train(wasTraining);
  int64_t V = logits.size(2), k = std::clamp<int64_t>(o.topK > 0 ? o.topK : 10, 1, 10);
  std::vector<float> all = logits.contiguous().toVector<float>();
  std::string filled, listing;
  size_t pieceFrom = 0;
  for (size_t m = 0; m < masks.size(); ++m) {
    const float* row = all.data() + masks[m] * size_t(V);
    // Probabilities over the whole vocabulary; the data's tokens are the candidates.
    double mx = *std::max_element(row, row + V), z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
    std::vector<int64_t> order;
    for (int64_t v = 0; v < dataVocab_; ++v)
      if (v != special_.pad && v != special_.cls && v != special_.sep && v != special_.mask)
        order.push_back(v);
    auto top = std::min<int64_t>(k, int64_t(order.size()));
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](int64_t a, int64_t b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    size_t at = prompt.find(kMaskText, pieceFrom);
    filled += prompt.substr(pieceFrom, at - pieceFrom) + tokenText(order[0]);
    pieceFrom = at + kMaskText.size();
    listing += fmt::format("\n[MASK] {}:", m + 1);
    for (int64_t i = 0; i < top; ++i)
      listing += fmt::format(" {} {:.3f}", quoted(tokenText(order[size_t(i)])),
                             std::exp(double(row[order[size_t(i)]]) - mx) / z);
  }
  filled += prompt.substr(pieceFrom);
  return Generation{filled + listing, false};
}

}  // namespace strata::data
