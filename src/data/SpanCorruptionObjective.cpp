#include "strata/data/SpanCorruptionObjective.h"

#include <algorithm>

#include "strata/autograd/GradMode.h"
#include "strata/data/SentencePieceTokenizer.h"

namespace strata::data {

SpanCorruptionObjective::SpanCorruptionObjective(std::shared_ptr<models::T5> model,
                                                 std::shared_ptr<const Tokenizer> tokenizer, uint64_t seed,
                                                 const SpanCorruptionOptions& corruption)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), seed_(seed), corruption_(corruption) {
  STRATA_CHECK(model_ != nullptr, "SpanCorruptionObjective: no model given");
  const models::T5Config& c = model_->config();
  // NOTE [T5 token ids]: a SentencePiece model's own ids with HF's 100 sentinels after its pieces, else
  // ByT5's.
  const auto* sentencePiece = dynamic_cast<const SentencePieceTokenizer*>(tokenizer_.get());
  if (sentencePiece != nullptr) {
    int64_t pieces = sentencePiece->vocabSize();
    ids_ = {sentencePiece->padId(), sentencePiece->eosId(), sentencePiece->unkId(), 0,
            pieces + kSentencePieceSentinels};
    STRATA_USER_CHECK(
        ids_.pad >= 0 && ids_.eos >= 0,
        "t5: the SentencePiece model has no {} piece; span corruption needs <pad> (the decoder's "
        "start) and </s> (T5's spiece.model has <pad> 0, </s> 1, <unk> 2; train one with "
        "--pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1)",
        ids_.pad < 0 ? "<pad>" : "</s>");
    STRATA_USER_CHECK(ids_.sentinelEnd <= c.vocabSize,
                      "t5: the SentencePiece model's {} pieces and the {} sentinels after them (<extra_id_0> "
                      "is id {}, as HF's T5Tokenizer has it) need model.vocab_size {} at least (it is {})",
                      pieces, kSentencePieceSentinels, ids_.sentinelEnd - 1, ids_.sentinelEnd, c.vocabSize);
  } else {
    ids_ = {0, 1, 2, 3, c.vocabSize};
  }
  corruption_.vocabSize = ids_.sentinelEnd;
  corruption_.eosTokenId = ids_.eos;
  // The longest window whose corruption fits both stacks' lengths (HF's compute_input_and_target_lengths).
  int64_t sentinels = 0;
  for (int64_t length = 2; length <= 2 * c.seqLength + 16; ++length) {
    SpanCorruptionLengths l = spanCorruptionLengths(length, corruption_);
    if (l.inputLength > c.seqLength || l.targetLength > c.decoderSeqLength) continue;
    window_ = length;
    // inputs + targets = length + 2 x spans + 2 (each span's sentinel on both sides, EOS on both)
    sentinels = (l.inputLength + l.targetLength - length - 2) / 2;
  }
  STRATA_USER_CHECK(
      window_ >= 2,
      "t5: model.seq_length {} and model.decoder_seq_length {} are too short for span corruption",
      c.seqLength, c.decoderSeqLength);
  if (sentencePiece != nullptr) {
    dataVocab_ = sentencePiece->vocabSize();
    STRATA_USER_CHECK(sentinels <= kSentencePieceSentinels,
                      "t5: a window of {} tokens (model.seq_length {}, model.decoder_seq_length {}) has {} "
                      "noise spans, more than the {} sentinels a SentencePiece tokenizer has",
                      window_, c.seqLength, c.decoderSeqLength, sentinels, kSentencePieceSentinels);
    return;
  }
  dataVocab_ = c.vocabSize - ids_.firstDataId - sentinels;
  STRATA_USER_CHECK(
      dataVocab_ > 0,
      "t5: model.vocab_size ({}) leaves no ids for data beside [PAD] [EOS] [UNK] and {} sentinels",
      c.vocabSize, sentinels);
  if (tokenizer_)
    STRATA_USER_CHECK(
        tokenizer_->vocabSize() <= dataVocab_,
        "t5: the tokenizer's {} tokens (ids from 3), [PAD] [EOS] [UNK] and the {} sentinels of a "
        "window of {} tokens need model.vocab_size {} at least (it is {})",
        tokenizer_->vocabSize(), sentinels, window_, tokenizer_->vocabSize() + 3 + sentinels, c.vocabSize);
}

Tensor SpanCorruptionObjective::loss(const TokenBatch& batch, DType compute) {
  SpanCorruptionBatch in = inputs(batch);
  return model_->loss(in.inputIds, Tensor(), models::t5ShiftRight(in.labels, ids_.pad, ids_.pad), in.labels,
                      compute);
}

SpanCorruptionBatch SpanCorruptionObjective::inputs(const TokenBatch& batch) const {
  const Tensor& windows = batch.ids;
  STRATA_CHECK(windows.dim() == 2, "t5: a batch of windows must be [batch, tokens], got {}",
               toString(windows.shape()));
  int64_t B = windows.size(0), T = windows.size(1);
  std::vector<int64_t> ids = windows.to(Device::cpu(), DType::I64).contiguous().toVector<int64_t>();
  for (int64_t& id : ids) id += ids_.firstDataId;
  // Two Philox counters per token (the noise and gap segmentations).
  return spanCorrupt(Tensor::fromVector<int64_t>(ids, {B, T}, windows.device()), corruption_,
                     corruptionSeed(seed_, batch.split), uint64_t(batch.index) * uint64_t(2 * B * T));
}

std::vector<std::pair<std::string, Tensor>> SpanCorruptionObjective::modelInputs(
    const TokenBatch& batch) const {
  SpanCorruptionBatch in = inputs(batch);
  return {{"input_ids", in.inputIds}, {"labels", in.labels}};
}

std::vector<std::pair<std::string, Tensor>> SpanCorruptionObjective::logits(const TokenBatch& batch,
                                                                            DType compute) {
  SpanCorruptionBatch in = inputs(batch);
  return {{"logits", model_->logits(in.inputIds, Tensor(),
                                    models::t5ShiftRight(in.labels, ids_.pad, ids_.pad), compute)}};
}

int64_t SpanCorruptionObjective::firstSentinelId() const {
  // Every id above the tokenizer's is a sentinel (not only those a training window uses): a model decodes the
  // same whatever model.decoder_seq_length says.
  return ids_.firstDataId + (tokenizer_ ? tokenizer_->vocabSize() : dataVocab_);
}

std::string SpanCorruptionObjective::decodeIds(const std::vector<int64_t>& ids) const {
  // Runs of data tokens decode together (a byte tokenizer's UTF-8 spans several ids).
  std::string out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (!run.empty() && tokenizer_) out += tokenizer_->decode(run);
    run.clear();
  };
  int64_t end = ids_.sentinelEnd, sentinels = firstSentinelId();
  for (int64_t id : ids) {
    // A SentencePiece model's <pad> and </s> lie among its pieces; they decode to nothing (HF's
    // skip_special_tokens), as ByT5's below the data do. Ids past the sentinels (a padded vocabulary) too.
    bool special = id == ids_.pad || id == ids_.eos;
    if (!special && id >= ids_.firstDataId && id < sentinels) {
      run.push_back(int32_t(id - ids_.firstDataId));
      continue;
    }
    flush();
    if (id >= sentinels && id < end) out += detail::format("<extra_id_{}>", end - 1 - id);
    if (id == ids_.unk && ids_.unk < ids_.firstDataId) out += "<unk>";
  }
  flush();
  return out;
}

std::optional<Generation> SpanCorruptionObjective::generate(const std::string& prompt,
                                                            const GenerateOptions& o, DType compute) {
  STRATA_CHECK(tokenizer_ != nullptr, "SpanCorruptionObjective: generating needs a tokenizer");
  int64_t end = ids_.sentinelEnd;
  // The encoder's input: the prompt's tokens with each "<extra_id_N>" as sentinel N, then EOS.
  std::vector<int64_t> input;
  auto encode = [&](const std::string& text) {
    if (!text.empty())
      for (int32_t id : tokenizer_->encode(text)) input.push_back(int64_t(id) + ids_.firstDataId);
  };
  const std::string open = "<extra_id_";
  size_t from = 0;
  while (from < prompt.size()) {
    size_t at = prompt.find(open, from), close = std::string::npos;
    int64_t n = -1;
    if (at != std::string::npos) {
      close = prompt.find('>', at);
      std::string digits =
          close == std::string::npos ? "" : prompt.substr(at + open.size(), close - at - open.size());
      if (!digits.empty() && digits.size() < 6 && std::all_of(digits.begin(), digits.end(), ::isdigit))
        n = std::stoll(digits);
    }
    if (n < 0 || end - 1 - n < firstSentinelId()) {
      // No (valid) marker from here: the rest up to the next candidate is text.
      size_t end = at == std::string::npos ? prompt.size() : at + open.size();
      encode(prompt.substr(from, end - from));
      from = end;
      continue;
    }
    encode(prompt.substr(from, at - from));
    input.push_back(end - 1 - n);
    from = close + 1;
  }
  input.push_back(ids_.eos);
  NoGradGuard noGrad;
  bool wasTraining = model_->isTraining();
  model_->eval();
  Device device = model_->parameters().front().device();
  Tensor x = Tensor::fromVector<int64_t>(input, {1, int64_t(input.size())}, device);
  // Greedy unless asked otherwise (temperature < 0: the default).
  double temperature = o.temperature < 0 ? 0.0 : o.temperature;
  std::vector<int64_t> decoded{ids_.pad};
  for (int64_t step = 0; step < o.length; ++step) {
    Tensor y = Tensor::fromVector<int64_t>(decoded, {1, int64_t(decoded.size())}, device);
    Tensor logits = model_->logits(x, Tensor(), y, compute);
    std::vector<float> last =
        logits.select(1, logits.size(1) - 1).to(Device::cpu(), DType::F32).contiguous().toVector<float>();
    int64_t next = pickToken(last, temperature, o.topK, o.seed, uint64_t(step));
    if (next == ids_.eos) break;
    decoded.push_back(next);
  }
  model_->train(wasTraining);
  return Generation{decodeIds(std::vector<int64_t>(decoded.begin() + 1, decoded.end())), false};
}

}  // namespace strata::data
