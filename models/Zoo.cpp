#include "models/Zoo.h"

#include "models/gpt/Gpt.h"

namespace strata::models {

GptConfig gptConfig(const ModelSpec& s) {
  GptConfig c;
  c.numLayers = s.numLayers;
  c.hiddenSize = s.hiddenSize;
  c.numHeads = s.numHeads;
  c.ffnHiddenSize = s.ffnHiddenSize;
  c.seqLength = s.seqLength;
  c.vocabSize = s.vocabSize;
  c.dropout = s.dropout;
  c.layerNormEps = s.layerNormEps;
  c.bias = s.bias;
  c.initStd = s.initStd;
  c.seed = s.seed;
  c.device = s.device;
  return c;
}

std::shared_ptr<nn::CausalLM> buildModel(const ModelSpec& s) {
  if (s.arch == "gpt") return std::make_shared<Gpt>(gptConfig(s));
  STRATA_FAIL("unknown model.arch '{}' (available: gpt)", s.arch);
}

std::vector<std::string> architectures() {
  return {"gpt"};
}

}  // namespace strata::models
