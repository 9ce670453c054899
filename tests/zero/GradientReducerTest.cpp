// ZeRO's gradient reduction on one rank (the reductions across ranks: the mpirun suite's training tests):
// the reducer hands over each chunk's gradients once the step's last backward completed them, and refuses a
// step whose chunks did not complete exactly once.
#include <string>
#include <vector>

#include "TestUtil.h"
#include "models/Zoo.h"
#include "strata/autograd/Engine.h"
#include "strata/ops/Ops.h"
#include "strata/zero/ChunkGroups.h"
#include "strata/zero/GradientReducer.h"

using namespace strata;

TEST_CASE("the gradient reducer hands over the chunks' gradients after the last backward, and only then",
          "[zero][reducer]") {
  auto model = models::buildModel(test::tinyGptSpec());
  zero::ChunkManager chunks(model->namedParameters(), 8 << 10);
  REQUIRE(chunks.numChunks() > 2);
  zero::ChunkGroups groups(chunks, nullptr, nullptr);
  REQUIRE(groups.ranks() == 1);
  REQUIRE_FALSE(groups.communicates());
  for (int stage : {0, 2}) {
    INFO("stage " << stage);
    zero::GradientReducer reducer(chunks, groups, stage, Device::cpu());
    Tensor ids = ops::arange(0, 16, 1, DType::I64, Device::cpu()).view({1, 16});
    Tensor targets = ops::arange(1, 17, 1, DType::I64, Device::cpu()).view({1, 16});
    // Two micro-batches; the gradients are final only after the second.
    chunks.beginBackward(false);
    backward(model->loss(ids, targets, DType::F32));
    chunks.beginBackward(true);
    backward(model->loss(ids, targets, DType::F32));
    std::vector<Tensor> grads = reducer.finish();
    REQUIRE(grads.size() == chunks.numChunks());
    for (size_t k = 0; k < chunks.numChunks(); ++k) {
      // One rank: the chunk's whole buffer, which its parameters' gradients are views into.
      REQUIRE(grads[k].numel() == chunks.paddedElems(k));
      REQUIRE(grads[k].data() == chunks.gradients(k).data());
      for (const Tensor& p : chunks.parameters(k)) REQUIRE(p.grad().defined());
    }
    reducer.release();
    for (size_t k = 0; k < chunks.numChunks(); ++k) REQUIRE_FALSE(chunks.gradients(k).defined());
    // A step whose backward was never the last one: no chunk completed, and the reducer says so.
    chunks.beginBackward(false);
    backward(model->loss(ids, targets, DType::F32));
    REQUIRE(test::errorOf([&] { reducer.finish(); }).find("chunk 0: 0 gradient-complete notices") !=
            std::string::npos);
    chunks.releaseGradients();
  }
}
