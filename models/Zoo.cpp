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

std::vector<std::pair<std::string, Shape>> parameterShapes(const ModelSpec& s) {
  STRATA_USER_CHECK(s.arch == "gpt", "unknown model.arch '{}' (available: gpt)", s.arch);
  GptConfig g = gptConfig(s);
  int64_t C = g.hiddenSize, F = g.ffn();
  std::vector<std::pair<std::string, Shape>> out{{"wte.weight", {g.vocabSize, C}},
                                                 {"wpe.weight", {g.seqLength, C}}};
  auto linear = [&](const std::string& name, int64_t in, int64_t n) {
    out.emplace_back(name + ".weight", Shape{in, n});
    if (g.bias) out.emplace_back(name + ".bias", Shape{n});
  };
  auto norm = [&](const std::string& name) {
    out.emplace_back(name + ".weight", Shape{C});
    out.emplace_back(name + ".bias", Shape{C});
  };
  for (int64_t i = 0; i < g.numLayers; ++i) {
    std::string h = "h." + std::to_string(i) + ".";
    norm(h + "ln_1");
    linear(h + "attn.qkv", C, 3 * C);
    linear(h + "attn.proj", C, C);
    norm(h + "ln_2");
    linear(h + "mlp.fc", C, F);
    linear(h + "mlp.proj", F, C);
  }
  norm("ln_f");
  return out;
}

std::vector<std::string> architectures() {
  return {"gpt"};
}

}  // namespace strata::models
