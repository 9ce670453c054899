// The model zoo: builds a model by architecture name from one spec shared by the architectures.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/nn/CausalLM.h"

namespace strata::models {

struct ModelSpec {
  std::string arch = "gpt";
  int64_t numLayers = 4, hiddenSize = 128, numHeads = 4, ffnHiddenSize = 0, seqLength = 128, vocabSize = 256;
  double dropout = 0.0, layerNormEps = 1e-5, initStd = 0.02;
  bool bias = true;
  uint64_t seed = 1234;
  Device device = Device::cpu();
};

std::shared_ptr<nn::CausalLM> buildModel(const ModelSpec& spec);
struct GptConfig;
// The GPT architecture's config for a spec (what buildModel builds for arch "gpt").
GptConfig gptConfig(const ModelSpec& spec);
std::vector<std::string> architectures();
// Every parameter of the model a spec builds, by name and shape, in first-use order (the order a forward
// touches them; a tied tensor once), without building it: `strata info` plans chunks of models that would not
// fit here. A test checks it against the built model.
std::vector<std::pair<std::string, Shape>> parameterShapes(const ModelSpec& spec);

}  // namespace strata::models
