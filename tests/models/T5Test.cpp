#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "models/t5/T5.h"
#include "models/t5/T5Hf.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Generator.h"
#include "strata/ops/Ops.h"
#include "strata/zero/ChunkManager.h"

using namespace strata;

namespace {
models::T5Config tiny(bool v11) {
  models::T5Config c;
  c.numLayers = 2;
  c.numDecoderLayers = 1;
  c.hiddenSize = 16;
  c.numHeads = 2;
  c.headDim = 6;  // inner 12 != 16, as v1.1's shapes
  c.ffnHiddenSize = 24;
  c.vocabSize = 40;
  c.relativeAttentionNumBuckets = 8;
  c.relativeAttentionMaxDistance = 16;
  c.dropout = 0.0;
  c.gatedGelu = v11;
  c.tieWordEmbeddings = !v11;
  c.scaleDecoderOutputs = !v11;
  return c;
}
}  // namespace

TEST_CASE("T5 parameters match the spec's list for v1.0 and v1.1", "[models][t5]") {
  for (const char* act : {"relu", "gated_gelu"}) {
    models::ModelSpec s;
    s.arch = "t5";
    s.numLayers = 2;
    s.decoderNumLayers = 3;
    s.hiddenSize = 16;
    s.numHeads = 3;  // 16 % 3 != 0: kv_channels decides the heads' width
    s.kvChannels = 4;
    s.ffnHiddenSize = 20;
    s.vocabSize = 30;
    s.bias = false;
    s.activation = act;
    s.untieEmbeddingsAndOutputWeights = std::string(act) == "gated_gelu";
    auto model = models::buildModule(s);
    auto named = model->namedParameters();
    auto shapes = models::parameterShapes(s);
    REQUIRE(named.size() == shapes.size());
    for (size_t i = 0; i < named.size(); ++i) {
      INFO(named[i].first);
      REQUIRE(named[i].first == shapes[i].first);
      REQUIRE(named[i].second.shape() == shapes[i].second);
    }
    REQUIRE(model->numParameters() == models::numParameters(s));
    REQUIRE((named.back().first == "lm_head.weight") == s.untieEmbeddingsAndOutputWeights);
    REQUIRE(models::flopsPerToken(s) > 0);
  }
  models::ModelSpec s;
  s.arch = "t5";
  REQUIRE(test::errorOf([&] { models::buildModule(s); }).find("model.bias = false") != std::string::npos);
}

TEST_CASE("T5 encoder padding and decoder causality", "[models][t5]") {
  for (bool v11 : {false, true}) {
    models::T5 t5(tiny(v11));
    t5.eval();
    Tensor in = Tensor::fromVector<int64_t>({3, 4, 5, 0, 0}, {1, 5});
    Tensor inOther = Tensor::fromVector<int64_t>({3, 4, 5, 9, 9}, {1, 5});
    Tensor mask = Tensor::fromVector<int64_t>({1, 1, 1, 0, 0}, {1, 5});
    Tensor dec = Tensor::fromVector<int64_t>({0, 7, 8, 9}, {1, 4});
    Tensor decOther = Tensor::fromVector<int64_t>({0, 7, 20, 21}, {1, 4});
    // Padded encoder positions change neither the real encoder states nor the decoder's logits.
    test::requireClose(t5.encode(inOther, mask, DType::F32).narrow(1, 0, 3),
                       t5.encode(in, mask, DType::F32).narrow(1, 0, 3), 1e-6, 1e-5);
    Tensor la = t5.logits(in, mask, dec, DType::F32);
    REQUIRE(la.shape() == Shape({1, 4, 40}));
    test::requireClose(t5.logits(inOther, mask, dec, DType::F32), la, 1e-6, 1e-5);
    // Later decoder tokens do not change earlier logits.
    Tensor lb = t5.logits(in, mask, decOther, DType::F32);
    test::requireClose(lb.narrow(1, 0, 2), la.narrow(1, 0, 2), 1e-6, 1e-5);
    REQUIRE(test::closeness(lb.narrow(1, 2, 1).contiguous().toVector<double>(),
                            la.narrow(1, 2, 1).contiguous().toVector<double>(), 1e-6, 1e-5) > 1.0);
  }
}

TEST_CASE("T5 loss shifts the labels right and every parameter gets a gradient", "[models][t5]") {
  Tensor labels = Tensor::fromVector<int64_t>({7, 8, -100, 9, 10, 11}, {2, 3});
  REQUIRE(models::t5ShiftRight(labels).toVector<int64_t>() == std::vector<int64_t>{0, 7, 8, 0, 9, 10});
  for (bool v11 : {false, true}) {
    models::T5 t5(tiny(v11));
    Tensor in = Tensor::fromVector<int64_t>({3, 4, 5, 6, 7, 0}, {2, 3});
    Tensor mask = Tensor::fromVector<int64_t>({1, 1, 1, 1, 1, 0}, {2, 3});
    Tensor loss = t5.loss(in, mask, Tensor(), labels, DType::F32);
    // Equal to the cross-entropy of the logits on the shifted labels, -100 skipped.
    Tensor logits = t5.logits(in, mask, models::t5ShiftRight(labels), DType::F32);
    Tensor reference = crossEntropy(logits.reshape({-1, 40}), labels.reshape({-1}));
    REQUIRE(loss.item() == Approx(reference.item()).epsilon(1e-5));
    REQUIRE(loss.item() == Approx(std::log(40.0)).margin(1.0));
    backward(loss);
    for (auto& [name, p] : t5.namedParameters()) {
      INFO(name);
      REQUIRE(p.grad().defined());
      REQUIRE(ops::sum(ops::mul(p.grad(), p.grad())).item() > 0.0);
    }
  }
}

TEST_CASE("T5 HF layout: shared / encoder.block / decoder.block / lm_head, round trip", "[models][t5][hf]") {
  for (bool v11 : {false, true}) {
    models::T5Config c = tiny(v11);
    models::T5 a(c);
    models::checkHfLayoutCovers(a, models::t5HfLayout(c));
    auto hf = models::exportHf(a, models::t5HfLayout(c));
    std::map<std::string, Tensor> byName(hf.begin(), hf.end());
    REQUIRE(byName.at("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").shape() ==
            Shape({8, 2}));
    REQUIRE(byName.at("decoder.block.0.layer.1.EncDecAttention.k.weight").shape() == Shape({12, 16}));
    REQUIRE(byName.at("decoder.block.0.layer.0.SelfAttention.o.weight").shape() == Shape({16, 12}));
    REQUIRE(byName.count(v11 ? "decoder.block.0.layer.2.DenseReluDense.wi_1.weight"
                             : "decoder.block.0.layer.2.DenseReluDense.wi.weight"));
    REQUIRE(byName.count("lm_head.weight") == (v11 ? 1u : 0u));
    REQUIRE(byName.count("encoder.final_layer_norm.weight"));
    c.seed = 77;
    models::T5 b(c);
    models::importHf(b, models::t5HfLayout(c), byName);
    Tensor in = Tensor::fromVector<int64_t>({3, 4, 5}, {1, 3}),
           dec = Tensor::fromVector<int64_t>({0, 6}, {1, 2});
    test::requireClose(b.logits(in, Tensor(), dec, DType::F32), a.logits(in, Tensor(), dec, DType::F32), 0,
                       0);
    std::string json = models::t5HfConfigJson(c);
    REQUIRE(json.find(v11 ? "gated-gelu" : "\"relu\"") != std::string::npos);
  }
}

TEST_CASE(
    "Switch Transformers: T5 with experts in every other block, its parameters, first-use order and HF names",
    "[models][t5][moe][hf]") {
  models::T5Config c = tiny(false);
  c.numLayers = 4;
  c.numDecoderLayers = 2;
  c.moeNumExperts = 4;
  c.moeEvery = 2;
  c.moeCapacityFactor = 4.0;  // no token dropped: the import's logits compare exactly
  c.moeEvalCapacityFactor = 4.0;
  // HF's rule: block i is sparse when i % step == 1.
  REQUIRE(!c.isMoeLayer(0));
  REQUIRE(c.isMoeLayer(1));
  REQUIRE(!c.isMoeLayer(2));
  REQUIRE(c.isMoeLayer(3));
  models::T5 a(c);
  auto named = a.namedParameters();
  auto shapes = c.parameterShapes();
  REQUIRE(named.size() == shapes.size());
  for (size_t i = 0; i < named.size(); ++i) {
    INFO(named[i].first);
    REQUIRE(named[i].first == shapes[i].first);
    REQUIRE(named[i].second.shape() == shapes[i].second);
  }
  REQUIRE(a.numParameters() == c.numParameters());
  // The traced first-use order is the listed one (every expert runs every forward), so `strata plan` lays
  // out what training lays out.
  Tensor in = Tensor::fromVector<int64_t>({3, 4, 5, 6, 7, 8}, {1, 6}),
         dec = Tensor::fromVector<int64_t>({0, 6, 9}, {1, 3});
  GeneratorState rng = defaultGenerator().state();
  std::vector<std::string> order = zero::recordFirstUse(a, [&] {
    NoGradGuard noGrad;
    a.logits(in, Tensor(), dec, DType::F32);
  });
  defaultGenerator().setState(rng);
  REQUIRE(order.size() == shapes.size());
  for (size_t i = 0; i < order.size(); ++i) REQUIRE(order[i] == shapes[i].first);
  // A Switch layer's FLOPs count one expert per token and the router: below the parameters' 6 N.
  models::T5Config dense = c;
  dense.moeNumExperts = 0;
  REQUIRE(c.flopsPerToken() > dense.flopsPerToken());
  REQUIRE(c.flopsPerToken() < 1.01 * dense.flopsPerToken());
  // HF's SwitchTransformersForConditionalGeneration names, and a round trip through them.
  models::checkHfLayoutCovers(a, models::t5HfLayout(c));
  auto hf = models::exportHf(a, models::t5HfLayout(c));
  std::map<std::string, Tensor> byName(hf.begin(), hf.end());
  REQUIRE(byName.at("encoder.block.1.layer.1.mlp.router.classifier.weight").shape() == Shape({4, 16}));
  REQUIRE(byName.at("encoder.block.1.layer.1.mlp.experts.expert_3.wi.weight").shape() == Shape({24, 16}));
  REQUIRE(byName.at("decoder.block.1.layer.2.mlp.experts.expert_0.wo.weight").shape() == Shape({16, 24}));
  REQUIRE(byName.count("encoder.block.0.layer.1.mlp.wi.weight"));
  REQUIRE(byName.count("decoder.block.0.layer.2.mlp.wo.weight"));
  c.seed = 78;
  models::T5 b(c);
  models::importHf(b, models::t5HfLayout(c), byName);
  test::requireClose(b.logits(in, Tensor(), dec, DType::F32), a.logits(in, Tensor(), dec, DType::F32), 0, 0);
  // Its config.json, and back: the keys the zoo needs.
  std::string json = models::t5HfConfigJson(c);
  REQUIRE(json.find("\"switch_transformers\"") != std::string::npos);
  REQUIRE(json.find("\"num_sparse_encoder_layers\": 2") != std::string::npos);
  REQUIRE(json.find("\"num_sparse_decoder_layers\": 1") != std::string::npos);
  auto keys = models::modelConfigFromHf(json);
  REQUIRE(keys.at("model.arch") == "t5");
  REQUIRE(keys.at("model.moe_num_experts") == "4");
  REQUIRE(keys.at("model.moe_every") == "2");
  REQUIRE(keys.at("model.moe_top_k") == "1");
  // A step HF cannot express is refused on export.
  c.numLayers = 5;
  c.moeEvery = 3;
  REQUIRE(test::errorOf([&] { models::t5HfConfigJson(c); }).find("no HF form") != std::string::npos);
}

TEST_CASE(
    "T5's head: tying and the d_model^-0.5 scaling are separate (transformers 5.x's v1.1 is tied and "
    "unscaled)",
    "[models][t5][hf]") {
  Tensor in = Tensor::fromVector<int64_t>({3, 4, 5}, {1, 3}),
         dec = Tensor::fromVector<int64_t>({0, 6}, {1, 2});
  models::T5Config scaled = tiny(true);
  scaled.tieWordEmbeddings = true;
  scaled.scaleDecoderOutputs = true;
  models::T5Config unscaled = scaled;
  unscaled.scaleDecoderOutputs = false;
  models::T5 a(scaled), b(unscaled);  // one seed: the same weights
  Tensor la = a.logits(in, Tensor(), dec, DType::F32), lb = b.logits(in, Tensor(), dec, DType::F32);
  test::requireClose(lb, la * std::sqrt(16.0), 1e-5, 1e-5);
  // The spec's default follows the tying; model.scale_decoder_outputs sets it either way.
  models::ModelSpec s;
  s.arch = "t5";
  s.bias = false;
  REQUIRE(models::t5Config(s).scaleDecoderOutputs);
  s.untieEmbeddingsAndOutputWeights = true;
  REQUIRE(!models::t5Config(s).scaleDecoderOutputs);
  s.untieEmbeddingsAndOutputWeights = false;
  s.scaleDecoderOutputs = "false";
  REQUIRE(!models::t5Config(s).scaleDecoderOutputs);
  REQUIRE(models::t5Config(s).tieWordEmbeddings);
  REQUIRE(models::describeHead(s).find("tied to shared, decoder output unscaled") != std::string::npos);
  // HF's config.json says both, as transformers 5.x writes them.
  nlohmann::json j = nlohmann::json::parse(models::t5HfConfigJson(unscaled));
  REQUIRE(j.at("tie_word_embeddings") == true);
  REQUIRE(j.at("scale_decoder_outputs") == false);
  REQUIRE(!j.contains("n_positions"));  // T5 has no position table
  // Keys of other architectures are refused for t5, and t5's for them.
  s.maxPositionEmbeddings = 512;
  REQUIRE(test::errorOf([&] { models::t5Config(s); }).find("model.max_position_embeddings") !=
          std::string::npos);
  models::ModelSpec gpt;
  gpt.scaleDecoderOutputs = "true";
  REQUIRE(test::errorOf([&] { models::buildModule(gpt); }).find("model.scale_decoder_outputs") !=
          std::string::npos);
}
