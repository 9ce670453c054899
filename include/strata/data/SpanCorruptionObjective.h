// T5's span-corruption pre-training over windows of the data (data/Corruption.h): noise spans of mean
// length 3 covering 15% of a window, each replaced by one sentinel in the encoder input; the decoder learns
// the spans after their sentinels. The window is the longest whose corrupted input fits model.seq_length
// and whose targets fit model.decoder_seq_length (t5-mini: 141 tokens -> 128 inputs, 29 targets).
// generate() encodes the prompt (where "<extra_id_N>" stands for sentinel N) and decodes from it.
//
// NOTE [T5 token ids]
// HF's T5 convention (T5Tokenizer over T5's spiece.model, and the DataCollatorForT5MLM of
// run_t5_mlm_flax.py): the SentencePiece model's own ids, <pad> 0 (also decoder_start_token_id), </s> 1,
// <unk> 2, then its N pieces; the tokenizer appends 100 sentinels, so len(tokenizer) = N + 100 and
// <extra_id_k> is N + 99 - k (t5-small: N = 32000, <extra_id_0> = 32099; the model's vocab_size, 32128, is
// padded past them). The collator replaces each noise span of the input by the next sentinel counting down
// from len(tokenizer) - 1 and appends </s>; the labels are the spans, each after its sentinel, then </s>;
// the decoder's input is the labels shifted right with decoder_start_token_id in front.
// The objective follows it in one of two layouts:
// - data.tokenizer sentencepiece: the model's ids as they are (pad, eos and unk are the model's own, data
//   token t is id t) and the sentinels N + 99, N + 98, ...: a real T5 checkpoint fine-tunes on its own
//   ids. model.vocab_size must hold N + 100.
// - any other tokenizer (the byte-level default): ByT5's layout, [PAD] 0, [EOS] 1, [UNK] 2, then data token
//   t as t + 3, the sentinels counting down from model.vocab_size - 1.
// Either way, the data's ids must stay below the sentinels a window can use.
#pragma once

#include <memory>
#include <string>

#include "models/t5/T5.h"
#include "strata/data/Corruption.h"
#include "strata/data/Objective.h"

namespace strata::data {

// The ids of NOTE [T5 token ids] in one layout.
struct T5TokenIds {
  int64_t pad = 0, eos = 1, unk = 2;  // pad is also the decoder's start
  int64_t firstDataId = 3;            // data token t is id t + firstDataId
  int64_t sentinelEnd = 0;            // <extra_id_k> is sentinelEnd - 1 - k (HF: len(tokenizer))
};

class SpanCorruptionObjective final : public Objective {
 public:
  // HF's T5Tokenizer appends this many sentinels to a SentencePiece model (its extra_ids).
  static constexpr int64_t kSentencePieceSentinels = 100;

  // `tokenizer` may be null when nothing is generated.
  SpanCorruptionObjective(std::shared_ptr<models::T5> model, std::shared_ptr<const Tokenizer> tokenizer,
                          uint64_t seed, const SpanCorruptionOptions& corruption = {});

  nn::Module& model() override { return *model_; }
  int64_t windowLength() const override { return window_; }
  int64_t dataVocabSize() const override { return dataVocab_; }
  // T5's FLOPs per token count model.seq_length input tokens per sequence (models::T5Config).
  int64_t tokensPerSequence() const override { return model_->config().seqLength; }
  std::optional<double> flopsPerToken() const override { return model_->flopsPerToken(); }
  std::string modelName() const override { return "t5"; }
  Tensor loss(const TokenBatch& batch, DType compute) override;
  // The encoder inputs and decoder labels of a micro-batch: a pure function of the batch's windows, index and
  // split, and the seed.
  SpanCorruptionBatch inputs(const TokenBatch& batch) const;
  // inputs() as T5ForConditionalGeneration's {"input_ids", "labels"} (its decoder input is the labels shifted
  // right, models::t5ShiftRight, on both sides).
  std::vector<std::pair<std::string, Tensor>> modelInputs(const TokenBatch& batch) const override;
  // {"logits"} [B, S_d, vocab] of the decoder.
  std::vector<std::pair<std::string, Tensor>> logits(const TokenBatch& batch, DType compute) override;
  std::optional<Generation> generate(const std::string& prompt, const GenerateOptions& options,
                                     DType compute) override;
  std::string generateUsage() const override {
    return "decodes from the prompt as the encoder's input (<extra_id_N> marks a span to fill)";
  }

  const SpanCorruptionOptions& corruption() const { return corruption_; }
  const T5TokenIds& tokenIds() const { return ids_; }

 private:
  std::string decodeIds(const std::vector<int64_t>& ids) const;
  int64_t firstSentinelId() const;

  std::shared_ptr<models::T5> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  uint64_t seed_;
  SpanCorruptionOptions corruption_;
  T5TokenIds ids_;
  int64_t window_ = 0, dataVocab_ = 0;
};

}  // namespace strata::data
