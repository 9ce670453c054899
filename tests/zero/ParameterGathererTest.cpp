// ZeRO-3's parameter gathers on one rank (the gathers across ranks: the mpirun suite's stage-3 training):
// the chunks are not resident outside a module's forward and backward, the forward and backward read the
// values they would read unsharded, and the arena holds what is gathered at once.
#include <string>
#include <vector>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/nn/Linear.h"
#include "strata/nn/ModuleList.h"
#include "strata/ops/Ops.h"
#include "strata/zero/ChunkGroups.h"
#include "strata/zero/ParameterGatherer.h"

using namespace strata;

namespace {

// Each parameter's gradient after one loss's backward, by parameter order.
std::vector<std::vector<float>> gradientsOf(nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : model.namedParameters()) out.push_back(p.grad().toVector<float>());
  return out;
}

// A block that reads its child's weight itself: directly in its forward (outside the child's call, which
// ZeRO-3 does not gather for), or inside a call of the child (Module::call, the declared use).
class Peeking : public nn::Module {
 public:
  Peeking(Generator& gen, bool throughChildCall) : throughChildCall_(throughChildCall) {
    proj_ = registerModule("proj", std::make_shared<nn::Linear>(
                                       nn::LinearConfig{8, 8, /*bias=*/false, 0.5, Device::cpu()}, gen));
  }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override {
    auto body = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{tanh(matmul(in[0], proj_->weight))};
    };
    return throughChildCall_ ? proj_->call(inputs, body) : body(inputs);
  }

 private:
  bool throughChildCall_;
  std::shared_ptr<nn::Linear> proj_;
};

class PeekingModel : public nn::Module {
 public:
  explicit PeekingModel(bool throughChildCall) {
    Generator gen(5);
    blocks_ = registerModule("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 3; ++i) blocks_->append(std::make_shared<Peeking>(gen, throughChildCall));
  }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override { return (*blocks_)(inputs); }

 private:
  std::shared_ptr<nn::ModuleList> blocks_;
};

}  // namespace

TEST_CASE("stage 3's gatherer keeps chunks resident only while their modules run, with unchanged numbers",
          "[zero][gather][arena]") {
  Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
  Tensor targets = ops::arange(1, 17, 1, DType::I64, Device::cpu()).view({1, 16});
  // The unsharded reference: the same model in chunks, never evicted.
  auto reference = models::buildModel(test::tinyGptSpec());
  zero::ChunkManager referenceChunks(reference->namedParameters(), 8 << 10);
  Tensor referenceLoss = reference->loss(ids, targets, DType::F32);
  referenceChunks.beginBackward(true);
  backward(referenceLoss);
  auto referenceGrads = gradientsOf(*reference);

  for (bool arena : {true, false}) {
    INFO("arena " << arena);
    auto model = models::buildModel(test::tinyGptSpec());
    zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
    REQUIRE(chunks.numChunks() > 2);
    zero::ChunkGroups groups(chunks, nullptr, nullptr);
    // One rank: its shard of each chunk is the whole chunk.
    std::vector<Tensor> shards;
    for (size_t c = 0; c < chunks.numChunks(); ++c) shards.push_back(chunks.paddedFlat(c).clone());
    zero::ParameterGatherer gatherer(chunks, groups, shards, *model, Device::cpu(), /*prefetchDepth=*/1,
                                     arena);
    auto touch = [&] { model->namedParameters()[0].second.toVector<float>(); };
    REQUIRE(test::errorOf(touch).find("not resident") != std::string::npos);
    REQUIRE(test::errorOf(touch).find("parameter 'wte.weight'") != std::string::npos);
    REQUIRE(gatherer.arenas().empty() == !arena);
    // Two passes: the first records the order of the gathers, the second prefetches along it.
    for (int pass = 0; pass < 2; ++pass) {
      INFO("pass " << pass);
      Tensor loss = model->loss(ids, targets, DType::F32);
      gatherer.forwardDone();
      REQUIRE(test::errorOf(touch).find("not resident") != std::string::npos);
      REQUIRE(loss.item() == referenceLoss.item());
      chunks.beginBackward(true);
      backward(loss);
      gatherer.backwardDone();
      REQUIRE(test::errorOf(touch).find("not resident") != std::string::npos);
      REQUIRE(gradientsOf(*model) == referenceGrads);
      chunks.releaseGradients();
      // A few modules' chunks at a time, never all of them, each in an arena slot (one arena per slot
      // class), and every slot back.
      REQUIRE(gatherer.peakGathered() > 0);
      REQUIRE(gatherer.peakGathered() < chunks.numChunks());
      size_t slotsPeak = 0;
      for (const zero::ChunkArena* a : gatherer.arenas()) {
        REQUIRE(a->stats().inUse == 0);
        slotsPeak += a->stats().peakInUse;
      }
      if (arena) REQUIRE(slotsPeak >= gatherer.peakGathered());
    }
  }
}

TEST_CASE("stage 3: a module reading a child's parameter outside the child's call is told which and how",
          "[zero][gather]") {
  Generator gen(6);
  Tensor x = ops::randn({4, 8}, gen);
  // The unsharded reference, and a model that reads its children's weights inside their calls.
  PeekingModel reference(/*throughChildCall=*/true);
  Tensor referenceOut = reference.forward({x})[0];
  backward(sum(referenceOut));
  for (bool throughChildCall : {false, true}) {
    INFO("through the child's call " << throughChildCall);
    PeekingModel model(throughChildCall);
    // One small chunk per block: nothing but the child's own call gathers its weight.
    zero::ChunkManager chunks(model.namedParameters(), 256);
    REQUIRE(chunks.numChunks() == 3);
    zero::ChunkGroups groups(chunks, nullptr, nullptr);
    std::vector<Tensor> shards;
    for (size_t c = 0; c < chunks.numChunks(); ++c) shards.push_back(chunks.paddedFlat(c).clone());
    zero::ParameterGatherer gatherer(chunks, groups, shards, model, Device::cpu(), /*prefetchDepth=*/1,
                                     /*arena=*/false);
    if (throughChildCall) {
      Tensor out = model.forward({x})[0];
      gatherer.forwardDone();
      REQUIRE(out.toVector<float>() == referenceOut.toVector<float>());
      chunks.beginBackward(true);
      backward(sum(out));
      gatherer.backwardDone();
      REQUIRE(gradientsOf(model) == gradientsOf(reference));
      continue;
    }
    // On one rank without ZeRO-3 this forward works; here it names the parameter, its module and the fix.
    std::string error = test::errorOf([&] { model.forward({x}); });
    INFO(error);
    REQUIRE(error.find("parameter 'blocks.0.proj.weight'") != std::string::npos);
    REQUIRE(error.find("not resident") != std::string::npos);
    REQUIRE(error.find("resident under ZeRO-3 only during its module's own call") != std::string::npos);
    REQUIRE(error.find("'blocks.0.proj'") != std::string::npos);
    REQUIRE(error.find("module.call(inputs, body)") != std::string::npos);
    REQUIRE(error.find("nn::fusedCall") != std::string::npos);
  }
}

TEST_CASE(
    "homes off the device: only the homed chunks are gathered, each from its home, with unchanged numbers",
    "[zero][gather][homes]") {
  // NOTE [Parameter homes]: stage 0 (no gathers across ranks), every other chunk homed on the host.
  Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
  Tensor targets = ops::arange(1, 17, 1, DType::I64, Device::cpu()).view({1, 16});
  auto reference = models::buildModel(test::tinyGptSpec());
  zero::ChunkManager referenceChunks(reference->namedParameters(), 8 << 10);
  Tensor referenceLoss = reference->loss(ids, targets, DType::F32);
  referenceChunks.beginBackward(true);
  backward(referenceLoss);
  auto referenceGrads = gradientsOf(*reference);

  auto model = models::buildModel(test::tinyGptSpec());
  zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
  size_t n = chunks.numChunks();
  REQUIRE(n > 2);
  zero::ChunkGroups groups(chunks, nullptr, nullptr);
  std::vector<Tensor> homes;
  std::vector<zero::Tier> tiers;
  for (size_t c = 0; c < n; ++c) {
    tiers.push_back(c % 2 == 0 ? zero::Tier::Host : zero::Tier::Device);
    // A homed chunk's values live in a buffer of their own; a device chunk's home is the chunk itself.
    homes.push_back(tiers[c] == zero::Tier::Host ? chunks.paddedFlat(c).clone() : chunks.paddedFlat(c));
  }
  zero::ParameterGatherer gatherer(chunks, groups, homes, *model, Device::cpu(), /*prefetchDepth=*/1,
                                   /*arena=*/true, tiers, /*acrossRanks=*/false);
  auto resident = [&] {
    std::vector<bool> out;
    for (size_t c = 0; c < n; ++c) out.push_back(chunks.storage(c)->resident());
    return out;
  };
  std::vector<bool> deviceChunks;
  for (size_t c = 0; c < n; ++c) deviceChunks.push_back(tiers[c] == zero::Tier::Device);
  REQUIRE(resident() == deviceChunks);
  for (int pass = 0; pass < 2; ++pass) {
    INFO("pass " << pass);
    Tensor loss = model->loss(ids, targets, DType::F32);
    gatherer.forwardDone();
    REQUIRE(resident() == deviceChunks);
    REQUIRE(loss.item() == referenceLoss.item());
    chunks.beginBackward(true);
    backward(loss);
    gatherer.backwardDone();
    REQUIRE(resident() == deviceChunks);
    REQUIRE(gradientsOf(*model) == referenceGrads);
    chunks.releaseGradients();
    REQUIRE(gatherer.peakGathered() > 0);
    REQUIRE(gatherer.peakGathered() <= (n + 1) / 2);
  }
  // What the update writes into a home is what the next gather brings: zeroed homes change the loss.
  gatherer.homesWritable();
  for (size_t c = 0; c < n; c += 2) ops::fill(homes[c], 0.0);
  Tensor changed = model->loss(ids, targets, DType::F32);
  gatherer.forwardDone();
  REQUIRE(changed.item() != referenceLoss.item());
}
