#include <nlohmann/json.hpp>

#include "TestUtil.h"
#include "models/ZooHf.h"
#include "models/gpt/Gpt.h"
#include "models/gpt/GptHf.h"
#include "nn/HookTrace.h"

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

TEST_CASE("GPT's position table (model.max_position_embeddings, HF's n_positions) and its HF form",
          "[models][gpt][hf]") {
  models::ModelSpec s = test::tinyGptSpec();
  s.maxPositionEmbeddings = 40;
  auto shapes = models::parameterShapes(s);
  REQUIRE(shapes[1] == std::make_pair(std::string("wpe.weight"), Shape{40, 32}));
  auto model = models::buildModule(s);
  REQUIRE(model->numParameters() == models::numParameters(s));
  nlohmann::json j = nlohmann::json::parse(models::hfConfigJson(s));
  REQUIRE(j.at("n_positions") == 40);
  REQUIRE(j.at("n_inner").is_null());  // HF's 4 x n_embd
  auto keys = models::modelConfigFromHf(j.dump());
  REQUIRE(keys.at("model.max_position_embeddings") == "40");
  REQUIRE(keys.at("model.ffn_hidden_size") == "0");
  // A GPT with experts has no HF class: said as such, with what to use instead, not as a missing name.
  s.moeNumExperts = 2;
  for (const auto& f :
       std::vector<std::function<void()>>{[&] { models::hfConfigJson(s); }, [&] { models::hfLayout(s); },
                                          [&] { models::hfModelClass(s); }}) {
    std::string e = test::errorOf(f);
    REQUIRE(e.find("no HF transformers architecture") != std::string::npos);
    REQUIRE(e.find("strata convert CHECKPOINT OUT.safetensors") != std::string::npos);
  }
}

namespace {
// Forward and backward of `micro` micro-batches through gpt.loss under a HookTrace, checked as they go.
void traceMicroBatches(models::Gpt& gpt, test::HookTrace& trace, int micro) {
  for (int m = 0; m < micro; ++m) {
    size_t from = trace.events.size();
    Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8 + m}, {2, 4});
    Tensor targets = Tensor::fromVector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9 - m}, {2, 4});
    Tensor loss = gpt.loss(ids, targets, DType::F32) * (1.0 / micro);
    trace.recordGraph(loss);
    trace.checkForward(from);
    backward(loss);
  }
}
}  // namespace

TEST_CASE("GPT: hooks fire around every use of every parameter, forward and backward",
          "[models][gpt][hooks]") {
  for (int layers : {1, 2}) {
    INFO(layers << " layers");
    models::GptConfig cfg = tiny();
    cfg.numLayers = layers;
    models::Gpt gpt(cfg);
    // A parameter that no forward uses: it must still hear once per backward pass.
    for (auto& [name, m] : gpt.namedModules())
      if (name == "h.0.mlp") m->registerParameter("spare", ops::zeros({4}));
    test::HookTrace trace(gpt, false);
    traceMicroBatches(gpt, trace, 2);

    // Every module's hooks fired: the root, embeddings, the fused MLP's fc and proj, the attention's
    // projections.
    std::set<std::string> all(trace.modules.begin(), trace.modules.end());
    REQUIRE(trace.modulesWith(test::HookTrace::Kind::FwdPre, 0) == all);
    REQUIRE(trace.modulesWith(test::HookTrace::Kind::FwdPost, 0) == all);
    REQUIRE(trace.modulesWith(test::HookTrace::Kind::BwdPre, 0) == all);
    // Each parameter was used in forward (except the spare) and notified once per micro-batch.
    for (auto& p : trace.params) {
      INFO(p.name);
      REQUIRE(trace.forwardUses.count(p.name) == (p.name == "h.0.mlp.spare" ? 0u : 1u));
    }
    REQUIRE(trace.checkBackward(0).size() == 2);
    for (auto& e : trace.events)
      if (e.kind == test::HookTrace::Kind::GradComplete)
        REQUIRE(e.gradDefined == (e.name != "h.0.mlp.spare"));
    // The tied table: wte is called twice per forward (lookup and head), so its hooks fire around both uses.
    int wteCalls = 0;
    for (auto& e : trace.events) wteCalls += e.kind == test::HookTrace::Kind::FwdPre && e.name == "wte";
    REQUIRE(wteCalls == 4);
    REQUIRE(trace.forwardUses["wte.weight"].size() == 2);
    // The second micro-batch accumulated into the first one's gradient buffers.
    for (auto& [name, storages] : trace.gradStorages) {
      INFO(name);
      REQUIRE(storages.size() == 1);
    }
  }
}

TEST_CASE("GPT under a simulated ZeRO-3: parameters are read only inside their modules' calls",
          "[models][gpt][hooks]") {
  // Each parameter holds NaN except between its module's forward pre- and post-hook, and from a backward
  // pre-hook to the backward post-hook or the gradient-complete notice (see HookTrace).
  models::Gpt reference(tiny());
  Tensor ids = Tensor::fromVector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  Tensor expectedLogits = reference.logits(ids, DType::F32);
  backward(reference.loss(ids, ids, DType::F32));

  models::Gpt gpt(tiny());
  test::HookTrace trace(gpt, true);
  for (auto& p : trace.params) REQUIRE(test::HookTrace::released(p));
  traceMicroBatches(gpt, trace, 2);
  REQUIRE(trace.checkBackward(0).size() == 2);
  for (auto& p : trace.params) REQUIRE(test::HookTrace::released(p));
  // The logits path, tied head included, and the numbers are the unevicted model's.
  Tensor logits = gpt.logits(ids, DType::F32);
  REQUIRE(logits.toVector<float>() == expectedLogits.toVector<float>());
  gpt.zeroGrad();
  backward(gpt.loss(ids, ids, DType::F32));
  auto expected = reference.namedParameters();
  auto got = gpt.namedParameters();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    REQUIRE(got[i].second.grad().toVector<float>() == expected[i].second.grad().toVector<float>());
  }
}
