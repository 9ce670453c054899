#include "strata/data/Objective.h"

#include <algorithm>
#include <cmath>

#include "models/Zoo.h"
#include "models/bert/Bert.h"
#include "models/t5/T5.h"
#include "strata/config/Resolve.h"
#include "strata/core/Philox.h"
#include "strata/data/CausalLmObjective.h"
#include "strata/data/MaskedLmObjective.h"
#include "strata/data/SentencePieceTokenizer.h"
#include "strata/data/SpanCorruptionObjective.h"

namespace strata::data {

std::unique_ptr<Tokenizer> makeTokenizer(const config::Config& config) {
  if (config.data.tokenizer == "gpt2")
    return std::make_unique<Gpt2Tokenizer>(config.data.vocabFile, config.data.mergesFile);
  if (config.data.tokenizer == "sentencepiece")
    return std::make_unique<SentencePieceTokenizer>(config.data.vocabFile);
  return std::make_unique<ByteTokenizer>();
}

std::shared_ptr<Objective> makeObjective(const config::Config& config, Device device) {
  std::shared_ptr<const Tokenizer> tokenizer = makeTokenizer(config);
  return makeObjective(config.model.arch, models::buildModule(config::modelSpecFrom(config, device)),
                       std::move(tokenizer), config.train.seed);
}

std::shared_ptr<Objective> makeObjective(const std::string& arch, std::shared_ptr<nn::Module> model,
                                         std::shared_ptr<const Tokenizer> tokenizer, uint64_t seed) {
  STRATA_CHECK(model != nullptr, "makeObjective: no model given");
  switch (models::objective(arch)) {
    case models::Objective::CausalLM: {
      auto lm = std::dynamic_pointer_cast<nn::CausalLM>(model);
      STRATA_CHECK(lm != nullptr, "model.arch '{}' trains on next tokens, but its model is no nn::CausalLM",
                   arch);
      return std::make_shared<CausalLmObjective>(lm, std::move(tokenizer));
    }
    case models::Objective::MaskedLM: {
      auto bert = std::dynamic_pointer_cast<models::Bert>(model);
      STRATA_CHECK(bert != nullptr, "model.arch '{}' trains as a masked LM, but its model is no models::Bert",
                   arch);
      return std::make_shared<MaskedLmObjective>(bert, std::move(tokenizer), seed);
    }
    case models::Objective::SpanCorruption: {
      auto t5 = std::dynamic_pointer_cast<models::T5>(model);
      STRATA_CHECK(t5 != nullptr, "model.arch '{}' trains on span corruption, but its model is no models::T5",
                   arch);
      return std::make_shared<SpanCorruptionObjective>(t5, std::move(tokenizer), seed);
    }
  }
  STRATA_USER_FAIL("model.arch '{}' has no training objective", arch);
}

std::vector<std::pair<std::string, Tensor>> Objective::modelInputs(const TokenBatch&) const {
  STRATA_USER_FAIL("this training objective does not expose its model inputs (Objective::modelInputs)");
}

std::vector<std::pair<std::string, Tensor>> Objective::logits(const TokenBatch&, DType) {
  STRATA_USER_FAIL("this training objective does not expose its model's logits (Objective::logits)");
}

int64_t pickToken(const std::vector<float>& logits, double temperature, int64_t topK, uint64_t seed,
                  uint64_t step) {
  STRATA_CHECK(!logits.empty(), "pickToken: no logits");
  auto V = int64_t(logits.size());
  // Temperature, top-k, then a Philox draw (temperature 0 leaves the argmax alone above the rest).
  std::vector<std::pair<float, int64_t>> scored;
  scored.reserve(logits.size());
  for (int64_t v = 0; v < V; ++v)
    scored.emplace_back(logits[size_t(v)] / float(std::max(temperature, 1e-6)), v);
  std::sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first > b.first; });
  if (topK > 0 && topK < V) scored.resize(size_t(topK));
  double mx = scored[0].first, z = 0;
  for (auto& s : scored) z += std::exp(double(s.first) - mx);
  double u = double(philoxUniform(seed, step)) * z, acc = 0;
  for (auto& s : scored) {
    acc += std::exp(double(s.first) - mx);
    if (acc >= u) return s.second;
  }
  return scored.back().second;
}

uint64_t corruptionSeed(uint64_t seed, Split split) {
  // A key no data stream uses (those are seed * 2 + split), mixed so nearby seeds give unrelated keys.
  PhiloxOut r = philox4x32(split == Split::Train ? 0x6d61736bull : 0x76616c6dull, seed);
  return (uint64_t(r.x[0]) << 32) | r.x[1];
}

}  // namespace strata::data
