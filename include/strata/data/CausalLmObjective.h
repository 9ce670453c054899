// Next-token prediction for any nn::CausalLM (GPT, or a user's own model): the window's tokens are the
// inputs, the same window one token on the targets; generate() continues the prompt.
#pragma once

#include <memory>
#include <string>

#include "strata/data/Objective.h"
#include "strata/nn/CausalLM.h"

namespace strata::data {

class CausalLmObjective final : public Objective {
 public:
  // `tokenizer` may be null when nothing is generated.
  CausalLmObjective(std::shared_ptr<nn::CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer);

  nn::Module& model() override { return *model_; }
  int64_t windowLength() const override { return model_->contextLength(); }
  int64_t dataVocabSize() const override { return model_->vocabSize(); }
  int64_t tokensPerSequence() const override { return model_->contextLength(); }
  std::optional<double> flopsPerToken() const override { return model_->flopsPerToken(); }
  std::string modelName() const override { return model_->name(); }
  Tensor loss(const TokenBatch& batch, DType compute) override;
  std::optional<Generation> generate(const std::string& prompt, const GenerateOptions& options,
                                     DType compute) override;
  std::string generateUsage() const override { return "samples a continuation of the prompt"; }
  // {"input_ids", "target_ids"}: the window and the same window one token on.
  std::vector<std::pair<std::string, Tensor>> modelInputs(const TokenBatch& batch) const override;
  std::vector<std::pair<std::string, Tensor>> logits(const TokenBatch& batch, DType compute) override;

 private:
  std::shared_ptr<nn::CausalLM> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

// Samples `length` tokens after `prompt` from `model` with temperature and top-k (0 = all), decoded to text.
std::string sampleText(nn::CausalLM& model, const Tokenizer& tokenizer, Device device, DType compute,
                       const std::string& prompt, int64_t length, double temperature = 0.8, int64_t topK = 40,
                       uint64_t seed = 1);

}  // namespace strata::data
