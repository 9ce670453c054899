// ZeRO-3's parameter gathers on one rank (the gathers across ranks: the mpirun suite's stage-3 training):
// the chunks are not resident outside a module's forward and backward, the forward and backward read the
// values they would read unsharded, and the arena holds what is gathered at once.
#include <string>
#include <vector>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/autograd/Engine.h"
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
