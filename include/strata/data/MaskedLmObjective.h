// BERT's masked-LM pre-training over windows of the data: each sequence is [CLS] window [SEP] (with the
// next-sentence head: [CLS] A [SEP] B [SEP], B the window's second half or, half of the time, another
// row's), 15% of its tokens chosen and replaced 80/10/10 by [MASK] / a random token / themselves
// (data/Corruption.h); the loss is the MLM cross-entropy on the chosen tokens (plus NSP's). generate()
// fills each [MASK] of a prompt.
//
// Special tokens: a WordPiece vocabulary's own [PAD], [CLS], [SEP] and [MASK]; with any other tokenizer
// they are the last four ids of model.vocab_size ([PAD], [CLS], [SEP], [MASK]) and the data's ids lie
// below them (bert-mini: bytes 0..255, then 256..259). [PAD] is always the model's (model.pad_token_id,
// whose default is that vocab_size - 4): an HF checkpoint's pad_token_id (HF's default is 0) stays its [PAD],
// a token that is never chosen for masking and whose embedding row, as in HF, takes no gradient from lookups.
#pragma once

#include <memory>
#include <string>

#include "models/bert/Bert.h"
#include "strata/data/Corruption.h"
#include "strata/data/Objective.h"

namespace strata::data {

struct BertSpecialTokens {
  int64_t pad = -1, cls = -1, sep = -1, mask = -1;
};

// What a micro-batch becomes: the model's inputs and labels, i64 on the batch's device.
struct MlmInputs {
  Tensor ids;         // [B, S]: [CLS] ... [SEP] with 15% of the tokens chosen and replaced 80/10/10
  Tensor labels;      // [B, S]: the original id where chosen, -100 elsewhere
  Tensor tokenTypes;  // [B, S]: 0 for [CLS] A [SEP], 1 for B [SEP] (undefined without the NSP head)
  Tensor nspLabels;   // [B]: 0 when B follows A, 1 when it is another row's (undefined without the NSP head)
  Tensor positions;   // [M]: the chosen tokens' flat indices, padded (MlmBatch)
  Tensor positionLabels;  // [M]: their labels, -100 on the padding rows
};

class MaskedLmObjective final : public Objective {
 public:
  // `tokenizer` may be null when nothing is generated (the special tokens are then appended ones).
  MaskedLmObjective(std::shared_ptr<models::Bert> model, std::shared_ptr<const Tokenizer> tokenizer,
                    uint64_t seed);

  nn::Module& model() override { return *model_; }
  int64_t windowLength() const override;
  int64_t dataVocabSize() const override { return dataVocab_; }
  int64_t tokensPerSequence() const override { return model_->contextLength(); }
  std::optional<double> flopsPerToken() const override { return model_->flopsPerToken(); }
  std::string modelName() const override { return "bert"; }
  Tensor loss(const TokenBatch& batch, DType compute) override;
  // A pure function of the batch's windows, index and split, and the seed.
  MlmInputs inputs(const TokenBatch& batch) const;
  // inputs() as BertForMaskedLM's {"input_ids", "labels"}, or BertForPreTraining's {"input_ids",
  // "token_type_ids", "labels", "next_sentence_label"} with the NSP head.
  std::vector<std::pair<std::string, Tensor>> modelInputs(const TokenBatch& batch) const override;
  // {"logits"}, or {"prediction_logits", "seq_relationship_logits"} with the NSP head.
  std::vector<std::pair<std::string, Tensor>> logits(const TokenBatch& batch, DType compute) override;
  // Nothing without a [MASK] in the prompt; else the prompt with each [MASK] filled by its likeliest token,
  // then one line per [MASK] with its options.topK (at most 10) likeliest tokens and their probabilities.
  std::optional<Generation> generate(const std::string& prompt, const GenerateOptions& options,
                                     DType compute) override;
  std::string generateUsage() const override {
    return "fills each [MASK] in the prompt and lists its likeliest tokens";
  }

  const BertSpecialTokens& specialTokens() const { return special_; }
  const MlmMaskingOptions& masking() const { return masking_; }

 private:
  std::string tokenText(int64_t id) const;

  std::shared_ptr<models::Bert> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  uint64_t seed_;
  BertSpecialTokens special_;
  int64_t dataVocab_ = 0;
  MlmMaskingOptions masking_;
};

}  // namespace strata::data
