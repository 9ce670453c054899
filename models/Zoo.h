// The model zoo: builds a model by architecture name from one spec shared by the architectures.
#pragma once

#include <memory>
#include <string>
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

}  // namespace strata::models
