#include "TestUtil.h"
#include "models/gpt/Gpt.h"
#include "models/gpt/GptHf.h"

using namespace strata;

namespace {
models::GptConfig tiny() {
  models::GptConfig c;
  c.numLayers = 2;
  c.hiddenSize = 32;
  c.numHeads = 4;
  c.seqLength = 16;
  c.vocabSize = 50;
  return c;
}
}  // namespace

TEST_CASE("GPT names its parameters and counts them like the formula", "[models][gpt]") {
  models::Gpt gpt(tiny());
  auto named = gpt.namedParameters();
  REQUIRE(named.front().first == "wte.weight");
  REQUIRE(named[1].first == "wpe.weight");
  REQUIRE(named[2].first == "h.0.ln_1.weight");
  bool hasQkv = false;
  for (auto& [n, t] : named) hasQkv = hasQkv || n == "h.1.attn.qkv.weight";
  REQUIRE(hasQkv);
  REQUIRE(named.back().first == "ln_f.bias");
  REQUIRE(gpt.numParameters() == tiny().numParameters());
  REQUIRE(tiny().flopsPerToken() > 6.0 * double(tiny().numParameters()));
}

TEST_CASE("GPT is causal: later tokens do not change earlier logits", "[models][gpt]") {
  models::Gpt gpt(tiny());
  Tensor a = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6}, {1, 6});
  Tensor b = Tensor::fromVector<int64_t>({1, 2, 3, 40, 41, 42}, {1, 6});
  auto la = gpt.logits(a, DType::F32).toVector<float>(), lb = gpt.logits(b, DType::F32).toVector<float>();
  for (size_t i = 0; i < 3 * 50; ++i) REQUIRE(la[i] == Approx(lb[i]).margin(1e-6));
  REQUIRE(la[3 * 50] != Approx(lb[3 * 50]).margin(1e-6));
  // An untrained model predicts roughly uniformly: loss near ln(vocab).
  Tensor loss = gpt.loss(a, b, DType::F32);
  REQUIRE(loss.item() == Approx(std::log(50.0)).margin(0.3));
  REQUIRE_THROWS_AS(gpt.logits(ops::zeros({1, 17}, DType::I64), DType::F32), Error);
}

TEST_CASE("GPT gradients flow to every parameter, tied head included", "[models][gpt]") {
  models::Gpt gpt(tiny());
  Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  backward(gpt.loss(ids, ids, DType::F32));
  for (auto& [name, p] : gpt.namedParameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    REQUIRE(ops::sum(ops::mul(p.grad(), p.grad())).item() > 0.0);
  }
}

TEST_CASE("GPT names map to HF GPT-2 names and back", "[models][gpt][hf]") {
  models::Gpt gpt(tiny());
  for (auto& [name, p] : gpt.namedParameters()) {
    std::string hf = models::gptNameToHf(name);
    INFO(name << " -> " << hf);
    REQUIRE(hf.rfind("transformer.", 0) == 0);
    REQUIRE(models::gptNameFromHf(hf) == name);
  }
  REQUIRE(models::gptNameToHf("h.11.attn.qkv.weight") == "transformer.h.11.attn.c_attn.weight");
  REQUIRE(models::gptNameToHf("h.0.mlp.proj.bias") == "transformer.h.0.mlp.c_proj.bias");
  REQUIRE(models::gptNameFromHf("lm_head.weight").empty());
  REQUIRE(models::gptNameFromHf("transformer.h.0.attn.bias").empty());
  REQUIRE_THROWS_AS(models::gptNameToHf("encoder.weight"), Error);
}
