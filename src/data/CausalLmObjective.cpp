#include "strata/data/CausalLmObjective.h"

#include "strata/autograd/GradMode.h"

namespace strata::data {

CausalLmObjective::CausalLmObjective(std::shared_ptr<nn::CausalLM> model,
                                     std::shared_ptr<const Tokenizer> tokenizer)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)) {
  STRATA_CHECK(model_ != nullptr, "CausalLmObjective: no model given");
}

Tensor CausalLmObjective::loss(const TokenBatch& batch, DType compute) {
  return model_->loss(batch.ids, batch.targets, compute);
}

std::vector<std::pair<std::string, Tensor>> CausalLmObjective::modelInputs(const TokenBatch& batch) const {
  return {{"input_ids", batch.ids}, {"target_ids", batch.targets}};
}

std::vector<std::pair<std::string, Tensor>> CausalLmObjective::logits(const TokenBatch& batch,
                                                                      DType compute) {
  return {{"logits", model_->logits(batch.ids, compute)}};
}

std::optional<Generation> CausalLmObjective::generate(const std::string& prompt, const GenerateOptions& o,
                                                      DType compute) {
  STRATA_CHECK(tokenizer_ != nullptr, "CausalLmObjective: generating needs a tokenizer");
  // Training refuses such a pair already; a model imported from HF meets its tokenizer first here.
  STRATA_USER_CHECK(tokenizer_->vocabSize() <= model_->vocabSize(),
                    "the {} tokenizer has {} tokens but model.vocab_size is {}: its ids would fall outside "
                    "the model's vocabulary (data.tokenizer names the tokenizer)",
                    tokenizer_->identity().substr(0, tokenizer_->identity().find(':')),
                    tokenizer_->vocabSize(), model_->vocabSize());
  Device device = model_->parameters().front().device();
  double temperature = o.temperature < 0 ? 0.8 : o.temperature;
  return Generation{
      sampleText(*model_, *tokenizer_, device, compute, prompt, o.length, temperature, o.topK, o.seed), true};
}

std::string sampleText(nn::CausalLM& model, const Tokenizer& tokenizer, Device device, DType compute,
                       const std::string& prompt, int64_t length, double temperature, int64_t topK,
                       uint64_t seed) {
  NoGradGuard noGrad;
  bool wasTraining = model.isTraining();
  model.eval();
  std::vector<int32_t> ids = tokenizer.encode(prompt.empty() ? std::string("\n") : prompt);
  size_t promptLen = ids.size();
  int64_t ctx = model.contextLength();
  for (int64_t step = 0; step < length; ++step) {
    size_t start = ids.size() > size_t(ctx) ? ids.size() - size_t(ctx) : 0;
    std::vector<int64_t> window(ids.begin() + std::ptrdiff_t(start), ids.end());
    Tensor x = Tensor::fromVector(window, {1, int64_t(window.size())}, device);
    Tensor logits = model.logits(x, compute);
    std::vector<float> last =
        logits.select(1, logits.size(1) - 1).to(Device::cpu(), DType::F32).toVector<float>();
    last.resize(size_t(model.vocabSize()));
    ids.push_back(int32_t(pickToken(last, temperature, topK, seed, uint64_t(step))));
  }
  model.train(wasTraining);
  return tokenizer.decode(std::vector<int32_t>(ids.begin() + std::ptrdiff_t(promptLen), ids.end()));
}

}  // namespace strata::data
