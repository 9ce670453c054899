#include "TestUtil.h"
#include "models/gpt/Gpt.h"

using namespace strata;
using strata::test::errorOf;

TEST_CASE("a GPT pipeline stage builds only its blocks, under the whole model's names and numbers",
          "[nn][pipeline]") {
  models::GptConfig c;
  c.numLayers = 4;
  c.hiddenSize = 16;
  c.numHeads = 2;
  c.seqLength = 8;
  c.vocabSize = 64;
  models::Gpt whole(c);
  auto named = [](nn::Module& m) {
    std::map<std::string, std::vector<float>> out;
    for (auto& [name, p] : m.namedParameters()) out[name] = p.toVector<float>();
    return out;
  };
  std::map<std::string, std::vector<float>> reference = named(whole);
  // Two stages of two virtual stages: stage 1 holds chunks 1 and 3, blocks 1 and 3, the final norm and the
  // tied table.
  c.pipeline = nn::PipelineParallel{2, 1, 2};
  models::Gpt stage(c);
  std::map<std::string, std::vector<float>> mine = named(stage);
  CHECK(mine.count("h.1.attn.qkv.weight") == 1);
  CHECK(mine.count("h.3.mlp.fc.weight") == 1);
  CHECK(mine.count("h.0.attn.qkv.weight") == 0);
  CHECK(mine.count("h.2.ln_1.weight") == 0);
  CHECK(mine.count("wpe.weight") == 0);
  CHECK(mine.count("ln_f.weight") == 1);
  CHECK(mine.count("wte.weight") == 1);
  for (const auto& [name, values] : mine) {
    INFO(name);
    CHECK(values == reference.at(name));
  }
  CHECK(stage.tiedParameters() == std::vector<std::string>{"wte.weight"});
  CHECK(stage.stageActivationShape({3, 8}) == Shape{3, 8, 16});
  // The whole model's entry points are refused on a stage.
  Tensor ids = ops::zeros({1, 8}, DType::I64, Device::cpu());
  CHECK(errorOf([&] {
          stage.loss(ids, ids, DType::F32);
        }).find("join the stages' checkpoint with `strata convert`") != std::string::npos);
  // Chunk 1 (local 0) takes the previous chunk's output; chunk 3 (local 1) ends in the loss.
  Tensor x = ops::zeros({1, 8, 16}, DType::F32, Device::cpu());
  CHECK(stage.stageForward(0, x, ids, ids, DType::F32).shape() == Shape{1, 8, 16});
  CHECK(stage.stageForward(1, x, ids, ids, DType::F32).numel() == 1);
}
