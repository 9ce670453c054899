// ZeRO-3's parameter gathers on one rank (the gathers across ranks: the mpirun suite's stage-3 training):
// the chunks are not resident outside a module's forward and backward, the forward and backward read the
// values they would read unsharded, and the arena holds what is gathered at once.
#include <filesystem>
#include <fstream>
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
#include "strata/zero/NvmeTier.h"
#include "strata/zero/ParameterGatherer.h"

using namespace strata;

namespace {

// Each parameter's gradient after one loss's backward, by parameter order.
std::vector<std::vector<float>> gradientsOf(nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (auto& [name, p] : model.namedParameters()) out.push_back(p.grad().toVector<float>());
  return out;
}

// One sequence of the tiny GPT, and the unsharded reference on it: the same model in chunks of 8 KiB,
// never evicted, its loss and gradients.
struct Reference {
  Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
  Tensor targets = ops::arange(1, 17, 1, DType::I64, Device::cpu()).view({1, 16});
  Tensor loss;
  std::vector<std::vector<float>> grads;

  Reference() {
    auto model = models::buildModel(test::tinyGptSpec());
    zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
    loss = model->loss(ids, targets, DType::F32);
    chunks.beginBackward(true);
    backward(loss);
    grads = gradientsOf(*model);
  }
};

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
  Reference reference;  // the unsharded numbers
  const Tensor &ids = reference.ids, &targets = reference.targets;

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
      REQUIRE(loss.item() == reference.loss.item());
      chunks.beginBackward(true);
      backward(loss);
      gatherer.backwardDone();
      REQUIRE(test::errorOf(touch).find("not resident") != std::string::npos);
      REQUIRE(gradientsOf(*model) == reference.grads);
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
  Reference reference;  // the unsharded numbers
  const Tensor &ids = reference.ids, &targets = reference.targets;

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
    REQUIRE(loss.item() == reference.loss.item());
    chunks.beginBackward(true);
    backward(loss);
    gatherer.backwardDone();
    REQUIRE(resident() == deviceChunks);
    REQUIRE(gradientsOf(*model) == reference.grads);
    chunks.releaseGradients();
    REQUIRE(gatherer.peakGathered() > 0);
    REQUIRE(gatherer.peakGathered() <= (n + 1) / 2);
  }
  // What the update writes into a home is what the next gather brings: zeroed homes change the loss.
  gatherer.homesWritable();
  for (size_t c = 0; c < n; c += 2) ops::fill(homes[c], 0.0);
  Tensor changed = model->loss(ids, targets, DType::F32);
  gatherer.forwardDone();
  REQUIRE(changed.item() != reference.loss.item());
}

TEST_CASE(
    "homes on the SSD: chunks are read ahead from the tier through staging, gathered with unchanged "
    "numbers, and a changed extent is named",
    "[zero][gather][homes][nvme]") {
  // NOTE [Parameter homes]: stage 0, chunks homed on the SSD, in host memory and on the device in turn.
  Reference reference;  // the unsharded numbers
  const Tensor &ids = reference.ids, &targets = reference.targets;

  auto model = models::buildModel(test::tinyGptSpec());
  zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
  size_t n = chunks.numChunks();
  REQUIRE(n > 5);
  zero::ChunkGroups groups(chunks, nullptr, nullptr);
  std::vector<zero::Tier> tiers;
  std::vector<zero::NvmeTier::ChunkFields> fields(n);
  size_t ssdChunks = 0;
  for (size_t c = 0; c < n; ++c) {
    tiers.push_back(c % 3 == 0 ? zero::Tier::Nvme : c % 3 == 1 ? zero::Tier::Host : zero::Tier::Device);
    if (tiers[c] != zero::Tier::Nvme) continue;
    fields[c].withParameters(chunks.paddedElems(c), chunks.dtype());
    ++ssdChunks;
  }
  std::filesystem::path dir = test::freshDir("strata-gather-ssd");
  zero::NvmeTier tier(dir.string(), 0, DType::F32, fields);
  std::vector<Tensor> homes;
  for (size_t c = 0; c < n; ++c) {
    Tensor values = chunks.paddedFlat(c);
    if (tiers[c] == zero::Tier::Nvme)
      tier.wait(tier.writeAsync(c, {{zero::NvmeTier::Parameters, values.data(), values.dtype()}}));
    // An SSD chunk's home is its extent; a host chunk's a buffer of its own; a device chunk's the chunk.
    homes.push_back(tiers[c] == zero::Tier::Nvme   ? Tensor()
                    : tiers[c] == zero::Tier::Host ? values.clone()
                                                   : values);
  }
  const int64_t depth = 2;
  zero::ParameterGatherer gatherer(chunks, groups, homes, *model, Device::cpu(), depth, /*arena=*/true, tiers,
                                   /*acrossRanks=*/false, &tier);
  std::vector<bool> deviceChunks;
  for (size_t c = 0; c < n; ++c) deviceChunks.push_back(tiers[c] == zero::Tier::Device);
  auto resident = [&] {
    std::vector<bool> out;
    for (size_t c = 0; c < n; ++c) out.push_back(chunks.storage(c)->resident());
    return out;
  };
  REQUIRE(resident() == deviceChunks);
  const int passes = 3;
  for (int pass = 0; pass < passes; ++pass) {
    INFO("pass " << pass);
    Tensor loss = model->loss(ids, targets, DType::F32);
    gatherer.forwardDone();
    REQUIRE(loss.item() == reference.loss.item());
    chunks.beginBackward(true);
    backward(loss);
    gatherer.backwardDone();
    REQUIRE(resident() == deviceChunks);
    REQUIRE(gradientsOf(*model) == reference.grads);
    chunks.releaseGradients();
  }
  // Each pass reads every SSD chunk at least once; the passes after the first read ahead of the gathers,
  // through at most prefetch_depth + 1 buffers.
  REQUIRE(gatherer.ssdReads() >= ssdChunks * passes);
  REQUIRE(gatherer.ssdReadsAhead() > 0);
  REQUIRE(gatherer.stagingBuffers() >= 1);
  REQUIRE(gatherer.stagingBuffers() <= size_t(depth) + 1);
  REQUIRE(tier.bytesRead() > 0);

  // What the update writes into the extents is what the next gather brings: zeroed extents change the loss.
  gatherer.homesWritable();
  std::vector<float> zeros(size_t(chunks.paddedElems(0)), 0.0f);
  tier.wait(tier.writeAsync(0, {{zero::NvmeTier::Parameters, zeros.data(), DType::F32}}));
  Tensor changed = model->loss(ids, targets, DType::F32);
  gatherer.forwardDone();
  REQUIRE(changed.item() != reference.loss.item());

  // A byte of chunk 0's extent (the file's first) changed underneath: its gather names the file.
  gatherer.homesWritable();
  {
    std::fstream file(tier.path(), std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(file.good());
    char byte = 0;
    file.seekg(10);
    file.get(byte);
    file.seekp(10);
    file.put(char(byte ^ 0x10));
  }
  std::string e = test::errorOf([&] { model->loss(ids, targets, DType::F32); });
  INFO(e);
  REQUIRE(e.find("the SSD tier's file " + tier.path() + " is corrupted") != std::string::npos);
}
