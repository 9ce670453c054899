// T5's span-corruption pre-training over windows of the data (train/Corruption.h): noise spans of mean
// length 3 covering 15% of a window, each replaced by one sentinel in the encoder input; the decoder learns
// the spans after their sentinels. The window is the longest whose corrupted input fits model.seq_length
// and whose targets fit model.decoder_seq_length (t5-mini: 141 tokens -> 128 inputs, 29 targets).
// generate() encodes the prompt (where "<extra_id_N>" stands for sentinel N) and decodes from it.
//
// Ids follow ByT5: [PAD] 0 (also the decoder's start), [EOS] 1, [UNK] 2, then data token t as t + 3; the
// sentinels <extra_id_0>, <extra_id_1>, ... count down from model.vocab_size - 1. The data's ids must stay
// below the sentinels a window can use.
#pragma once

#include <memory>
#include <string>

#include "models/t5/T5.h"
#include "strata/train/Corruption.h"
#include "strata/train/Objective.h"

namespace strata::train {

class SpanCorruptionObjective final : public Objective {
 public:
  static constexpr int64_t kPadId = 0, kEosId = 1, kUnkId = 2, kFirstDataId = 3;

  // `tokenizer` may be null when nothing is generated.
  SpanCorruptionObjective(std::shared_ptr<models::T5> model, std::shared_ptr<const Tokenizer> tokenizer,
                          uint64_t seed, const SpanCorruptionOptions& corruption = {});

  nn::Module& model() override { return *model_; }
  int64_t windowLength() const override { return window_; }
  int64_t dataVocabSize() const override { return dataVocab_; }
  // T5's FLOPs per token count model.seq_length input tokens per sequence (models::T5Config).
  int64_t tokensPerSequence() const override { return model_->config().seqLength; }
  double flopsPerToken() const override { return model_->flopsPerToken(); }
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

 private:
  std::string decodeIds(const std::vector<int64_t>& ids) const;
  int64_t firstSentinelId() const;

  std::shared_ptr<models::T5> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  uint64_t seed_;
  SpanCorruptionOptions corruption_;
  int64_t window_ = 0, dataVocab_ = 0;
};

}  // namespace strata::train
