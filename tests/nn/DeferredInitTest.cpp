// Deferred parameters (nn/DeferredInit.h): a model built within a DeferParameters scope holds placeholders,
// and each makes, bit for bit, the value the eager build draws, its tensor-parallel slice and its model's
// own edits included.
#include <map>

#include "TestUtil.h"
#include "strata/autograd/GradMode.h"
#include "strata/nn/DeferredInit.h"
#include "strata/nn/Linear.h"

using namespace strata;

namespace {

std::shared_ptr<nn::Module> deferredBuild(const models::ModelSpec& spec) {
  nn::DeferParameters defer;
  return models::buildModule(spec);
}

// Every parameter of `deferred` is a placeholder of four bytes whose value is `eager`'s, bit for bit.
void checkDeferred(nn::Module& eager, nn::Module& deferred) {
  auto want = eager.namedParameters();
  auto got = deferred.namedParameters();
  REQUIRE(want.size() == got.size());
  REQUIRE(nn::hasDeferredParameters(deferred));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    REQUIRE(got[i].first == want[i].first);
    const Tensor& p = got[i].second;
    CHECK(nn::isDeferred(p));
    CHECK(p.shape() == want[i].second.shape());
    CHECK(p.requiresGrad());
    CHECK(p.storage()->bytes() == sizeof(float));
    Tensor v = nn::deferredValue(p);
    REQUIRE(v.isContiguous());
    CHECK(v.toVector<float>() == want[i].second.toVector<float>());
  }
  nn::materializeParameters(deferred);
  CHECK(!nn::hasDeferredParameters(deferred));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(got[i].second.isContiguous());
    CHECK(got[i].second.toVector<float>() == want[i].second.toVector<float>());
  }
}

}  // namespace

TEST_CASE("deferred parameters make the eager build's values: GPT, GPT-MoE, BERT, T5", "[nn][deferred]") {
  models::ModelSpec moe = test::tinyZooSpec("gpt", 64, 0);
  moe.numLayers = 2;
  moe.moeNumExperts = 4;
  moe.moeEvery = 2;
  for (const models::ModelSpec& spec : {test::tinyZooSpec("gpt", 64, 0), moe,
                                        test::tinyZooSpec("bert", 64, 0), test::tinyZooSpec("t5", 64, 8)}) {
    INFO(spec.arch << " with " << spec.moeNumExperts << " experts");
    auto eager = models::buildModule(spec);
    auto deferred = deferredBuild(spec);
    checkDeferred(*eager, *deferred);
  }
}

TEST_CASE("a deferred Linear's weight is the generator's own draws", "[nn][deferred]") {
  // Pinned to ops::randn of a generator in the same state, not to another build through initialParameter.
  Generator direct(11), gen(11);
  ops::randn({3, 5}, direct);  // earlier draws move both generators alike
  gen.reserve(15);
  Tensor want = ops::randn({4, 6}, direct, DType::F32, Device::cpu(), 0, 0.02);
  std::shared_ptr<nn::Linear> layer;
  {
    nn::DeferParameters defer;
    layer = std::make_shared<nn::Linear>(nn::LinearConfig{4, 6, true, 0.02, Device::cpu()}, gen);
  }
  REQUIRE(nn::isDeferred(layer->weight));
  CHECK(gen.state().offset == direct.state().offset);
  CHECK(nn::deferredValue(layer->weight).toVector<float>() == want.toVector<float>());
  CHECK(nn::deferredValue(layer->bias).toVector<float>() == std::vector<float>(6, 0.0f));
}

TEST_CASE("a write into a placeholder is refused, not lost to its recipe", "[nn][deferred]") {
  auto model = deferredBuild(test::tinyZooSpec("gpt", 64, 0));
  Tensor p = model->namedParameters().front().second;
  ops::fill(p.detach(), 1.0);
  CHECK(test::errorOf([&] { nn::deferredValue(p); }).find("was written before its value was made") !=
        std::string::npos);
}

TEST_CASE("deferred parameters make each expert-parallel rank's experts", "[nn][deferred]") {
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    models::ModelSpec spec = test::tinyZooSpec("gpt", 64, 0);
    spec.numLayers = 2;
    spec.moeNumExperts = 4;
    spec.expertParallel.size = 2;
    spec.expertParallel.rank = rank;
    spec.expertParallel.allToAll = [](const Tensor&, const Tensor&) {};  // not called: no forward runs
    auto eager = models::buildModule(spec);
    auto deferred = deferredBuild(spec);
    checkDeferred(*eager, *deferred);
  }
}

TEST_CASE("deferred parameters make each tensor-parallel rank's slice of the one-rank draws",
          "[nn][deferred]") {
  for (const std::string& arch : {"gpt", "bert", "t5"}) {
    for (int rank = 0; rank < 2; ++rank) {
      INFO(arch << " rank " << rank);
      models::ModelSpec spec = test::tinyZooSpec(arch, 64, arch == "t5" ? 8 : 0);
      spec.tensorParallel.size = 2;
      spec.tensorParallel.rank = rank;
      auto eager = models::buildModule(spec);
      auto deferred = deferredBuild(spec);
      checkDeferred(*eager, *deferred);
    }
  }
}

TEST_CASE("a deferred model runs a forward on its placeholders, and casting it makes its values",
          "[nn][deferred]") {
  models::ModelSpec spec = test::tinyZooSpec("gpt", 64, 0);
  auto eager = std::dynamic_pointer_cast<nn::CausalLM>(models::buildModule(spec));
  auto deferred = std::dynamic_pointer_cast<nn::CausalLM>(deferredBuild(spec));
  REQUIRE(deferred != nullptr);
  {
    // What the layout's first-use trace does: every parameter reads zero.
    NoGradGuard noGrad;
    deferred->eval();
    Tensor ids = ops::zeros({1, 8}, DType::I64);
    Tensor logits = deferred->logits(ids, DType::F32);
    for (float x : logits.toVector<float>()) CHECK(x == 0.0f);
    deferred->train();
  }
  CHECK(nn::hasDeferredParameters(*deferred));
  deferred->castParameters(DType::BF16);
  eager->castParameters(DType::BF16);
  CHECK(!nn::hasDeferredParameters(*deferred));
  auto want = eager->namedParameters();
  auto got = deferred->namedParameters();
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(got[i].second.dtype() == DType::BF16);
    CHECK(got[i].second.toVector<float>() == want[i].second.toVector<float>());
  }
}

TEST_CASE("editInitialValue edits a placeholder's value after its recipe, an eager value at once",
          "[nn][deferred]") {
  auto make = [] { return ops::full({2, 3}, 1.0, DType::F32, Device::cpu()); };
  auto edit = [](const Tensor& v) { ops::fill(v.narrow(1, 0, 1), 5.0); };
  std::vector<float> want{5, 1, 1, 5, 1, 1};
  Tensor eager = nn::initialParameter({2, 3}, Device::cpu(), make);
  nn::editInitialValue(eager, edit);
  CHECK(eager.toVector<float>() == want);
  Tensor placeholder;
  {
    nn::DeferParameters defer;
    CHECK(nn::DeferParameters::active());
    placeholder = nn::initialParameter({2, 3}, Device::cpu(), make);
  }
  CHECK(!nn::DeferParameters::active());
  nn::editInitialValue(placeholder, edit);
  CHECK(placeholder.toVector<float>() == std::vector<float>(6, 0.0f));
  CHECK(nn::deferredValue(placeholder).toVector<float>() == want);
  CHECK(!nn::isDeferred(Tensor()));
  CHECK(!nn::isDeferred(eager));
}
