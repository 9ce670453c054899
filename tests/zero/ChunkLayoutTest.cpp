#include <algorithm>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Generator.h"
#include "strata/nn/CausalLM.h"
#include "strata/ops/Ops.h"
#include "strata/zero/ChunkLayout.h"
#include "strata/zero/ChunkManager.h"

using namespace strata;

TEST_CASE("parameters pack into aligned chunks in first-use order, tied tensors once", "[zero][chunks]") {
  // 1 KiB chunks of fp32: 256 elements, aligned to 64 elements (256 bytes).
  std::vector<std::pair<std::string, Shape>> params = {
      {"emb", {10, 10}},  // 100
      {"a", {50}},        // starts at 128
      {"b", {100}},       // does not fit after a (178 -> 192 + 100 > 256): next chunk
      {"emb", {10, 10}},  // the tied head: already placed
      {"huge", {600}},    // larger than a chunk: a chunk of its own, 640 elements
      {"c", {10}},        // back into the open regular chunk, after b
  };
  zero::ChunkLayout layout = zero::planChunks(params, 1024, DType::F32);
  REQUIRE(layout.chunkElems == 256);
  REQUIRE(layout.slots.size() == 5);
  REQUIRE(layout.chunks.size() == 3);
  REQUIRE(layout.slot("emb").chunk == 0);
  REQUIRE(layout.slot("emb").offset == 0);
  REQUIRE(layout.slot("a").chunk == 0);
  REQUIRE(layout.slot("a").offset == 128);
  REQUIRE(layout.slot("b").chunk == 1);
  REQUIRE(layout.slot("b").offset == 0);
  REQUIRE(layout.slot("huge").chunk == 2);
  REQUIRE(layout.chunks[2].capacity == 640);
  REQUIRE(layout.slot("c").chunk == 1);
  REQUIRE(layout.slot("c").offset == 128);
  REQUIRE(layout.payloadElems() == 100 + 50 + 100 + 600 + 10);
  REQUIRE(layout.chunks[0].fill() == Approx(150.0 / 256.0));
  for (const auto& s : layout.slots) {
    REQUIRE(s.offset % 64 == 0);
    REQUIRE(s.offset + s.numel <= layout.chunks[size_t(s.chunk)].capacity);
  }
  REQUIRE_THROWS_AS(layout.slot("missing"), Error);
  std::string table = layout.table();
  REQUIRE(table.find("3 chunks") != std::string::npos);
  REQUIRE(table.find("emb .. a") != std::string::npos);
}

TEST_CASE("families keep their parameters in chunks of their own, each with its open chunk",
          "[zero][chunks]") {
  // 1 KiB chunks of fp32 (256 elements): the experts (family 1) interleave with the rest in first-use order.
  std::vector<std::pair<std::string, Shape>> params = {
      {"attn", {100}}, {"expert.0", {100}}, {"norm", {10}}, {"expert.1", {100}}, {"attn2", {50}}};
  zero::ChunkLayout layout = zero::planChunks(params, 1024, DType::F32, {0, 1, 0, 1, 0});
  REQUIRE(layout.chunks.size() == 2);
  REQUIRE(layout.slot("attn").chunk == 0);
  REQUIRE(layout.slot("norm").chunk == 0);
  REQUIRE(layout.slot("norm").offset == 128);
  REQUIRE(layout.slot("attn2").chunk == 0);
  REQUIRE(layout.slot("expert.0").chunk == 1);
  REQUIRE(layout.slot("expert.1").chunk == 1);
  REQUIRE(layout.slot("expert.1").offset == 128);
  REQUIRE(layout.chunks[0].family == 0);
  REQUIRE(layout.chunks[1].family == 1);
  // Without families the same parameters share chunks in order.
  REQUIRE(zero::planChunks(params, 1024, DType::F32).slot("expert.0").chunk == 0);
  REQUIRE_THROWS_AS(zero::planChunks(params, 1024, DType::F32, {0, 1}), Error);
  // The manager pads and shards each family for its own ranks.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, shape] : params)
    tensors.emplace_back(name, ops::zeros(shape, DType::F32, Device::cpu()));
  zero::ChunkFamilies families{[](const std::string& name) { return name.rfind("expert", 0) == 0 ? 1 : 0; },
                               {4, 3}};
  zero::ChunkManager manager(tensors, 1024, std::nullopt, 4, std::nullopt, families);
  REQUIRE(manager.numChunks() == 2);
  REQUIRE(manager.shards(0) == 4);
  REQUIRE(manager.shards(1) == 3);
  REQUIRE(manager.paddedElems(0) % 4 == 0);
  REQUIRE(manager.paddedElems(1) % 3 == 0);
  REQUIRE(manager.shard(1, 2).end == manager.paddedElems(1));
}

TEST_CASE("the zoo's parameter shapes are the built model's, in first-use order", "[zero][chunks][models]") {
  for (bool bias : {true, false}) {
    models::ModelSpec spec = test::tinyGptSpec();
    spec.bias = bias;
    auto model = models::buildModel(spec);
    auto named = model->namedParameters();
    auto shapes = models::parameterShapes(spec);
    REQUIRE(shapes.size() == named.size());
    for (size_t i = 0; i < named.size(); ++i) {
      INFO(named[i].first);
      REQUIRE(shapes[i].first == named[i].first);
      REQUIRE(shapes[i].second == named[i].second.shape());
    }
    // A 64 MiB plan of a 2-layer toy is one chunk; 1 KiB chunks split it and keep every parameter whole.
    REQUIRE(zero::planChunks(shapes, 64 << 20, DType::BF16).chunks.size() == 1);
    auto small = zero::planChunks(shapes, 16 << 10, DType::F32);
    REQUIRE(small.chunks.size() > 2);
    REQUIRE(small.payloadElems() == model->numParameters());
  }
  // GPT with MoE blocks: the router and every expert, in index order, however the tokens are routed (an
  // expert without tokens is still called: NOTE [MoE dispatch]). The traced first-use order is checked
  // against the listed shapes.
  models::ModelSpec moe = test::tinyGptSpec();
  moe.moeNumExperts = 4;
  moe.moeTopK = 2;
  moe.numLayers = 2;
  auto model = models::buildModel(moe);
  auto shapes = models::parameterShapes(moe);
  auto named = model->namedParameters();
  REQUIRE(shapes.size() == named.size());
  GeneratorState rng = defaultGenerator().state();
  std::vector<std::string> order = zero::recordFirstUse(*model, [&] {
    NoGradGuard noGrad;
    Tensor ids = ops::zeros({1, 8}, DType::I64, Device::cpu());
    model->loss(ids, ids, DType::F32);
  });
  defaultGenerator().setState(rng);
  REQUIRE(order.size() == shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    INFO(shapes[i].first);
    REQUIRE(order[i] == shapes[i].first);
    REQUIRE(shapes[i].first == named[i].first);
    REQUIRE(shapes[i].second == named[i].second.shape());
  }
  REQUIRE(std::count_if(shapes.begin(), shapes.end(),
                        [](const auto& s) { return s.first.find("h.1.mlp.experts.3.") == 0; }) == 4);
}
