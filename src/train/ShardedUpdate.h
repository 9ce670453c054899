// Private to the step engine: the step end over this rank's shards (NOTE [Step-end decision] in
// train/StepEngine.h). From the reduced gradients (zero::GradientReducer::finish) it sums the squared norm
// of this rank's shard pieces, reduces it with the step's loss over the ranks (one collective on the comm
// stream), reads both on the host, decides the step (finite; fp16's loss scale) and its clip coefficient,
// runs the optimizer over every tier, and at stages 1 and 2 gathers the chunks whole again from the ranks'
// updated shards (on the gather stream). It owns fp16's loss scaler; the optimizer is the model state's.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "strata/config/Config.h"
#include "strata/core/Tensor.h"
#include "strata/optim/LossScaler.h"
#include "strata/train/StepEngine.h"
#include "train/ModelState.h"

namespace strata::train {

// What a step end leaves: the outcome, and its values on the device (the loss and squared norm summed over
// the ranks, the norm, and the update's gradient scale). The engine holds the tensors until its step returns,
// as the locals of one sequential step would, so the memory the tracer reads after the first step is the
// same.
struct StepEnd {
  StepOutcome outcome;
  Tensor loss, sumSq, norm, coef;
};

class ShardedUpdate {
 public:
  ShardedUpdate(ModelState& state, const config::Config& config, DType compute);

  // fp16: the scale each micro-batch's loss is multiplied by before backward (the update unscales).
  bool scalesLoss() const { return scaler_ != nullptr; }
  double lossScale() const { return scaler_ ? scaler_->scale() : 1.0; }
  // The step end at learning rate `lr` from `grads` (per chunk, as GradientReducer::finish gives them) and
  // the sum of the micro-batches' scaled losses on this rank.
  StepEnd finish(const std::vector<Tensor>& grads, Tensor stepLoss, double lr);
  // Stages 1 and 2 on several ranks: every chunk gathered whole from the ranks' shards (a collective on
  // every rank).
  void gatherShards();
  // The loss scaler's counters in a checkpoint.
  void saveScaler(StepEngineState& state) const;
  void restoreScaler(const StepEngineState& state);
  // NOTE [Gradient homes] in zero/GradientReducer.h: chunk c's terms of the squared norm from `grads` (as
  // finish() would get them) while they are still on the device, kept for this step's finish(), which
  // then reads the chunk's gradients only for the update.
  void keepSquares(size_t c, const Tensor& grads);

 private:
  // The squared norm over this rank's shard of every chunk (the whole chunks on one rank); with `slices`,
  // over the parameters that are (true) or are not (false) tensor-parallel slices only. Each chunk's partial
  // sums (chunkSquares, or what keepSquares kept) are added in chunk order by one ops::sumParts, which
  // gives the bits of one sum over every piece: they depend neither on the chunk layout nor on where a
  // chunk's gradients are at the step's end.
  Tensor shardSquares(const std::vector<Tensor>& grads, std::optional<bool> slices = std::nullopt) const;
  // Chunk c's partial sums (ops::sumOfSquaresParts; undefined where this rank's shard holds none of the
  // parameters).
  Tensor chunkSquares(size_t c, const Tensor& grads, std::optional<bool> slices) const;
  // The global squared norm and loss: this rank's summed with every rank's, in rank order.
  void reduceOverRanks(Tensor& sumSq, Tensor& stepLoss) const;
  // The same under tensor parallelism: the slices' squares summed over the data-parallel and the
  // tensor-parallel group, the whole parameters' over the data-parallel group only (they are equal on every
  // rank of the tensor-parallel group).
  Tensor tensorParallelSquares(const std::vector<Tensor>& grads, Tensor& stepLoss) const;
  // NOTE [Pipeline stages] in nn/Pipeline.h: the squared norm and the loss summed over the stages (the
  // loss is the last stage's; the tied embedding counted on the first stage only).
  void reduceOverStages(Tensor& sumSq, Tensor& stepLoss) const;
  // The outcome's loss, norm and decision from the host's reads, and the update's gradient scale (unscaling
  // and clipping in one factor; undefined for 1).
  void decide(double scale, StepEnd& end);

  ModelState& state_;
  Device device_;
  double clipGrad_;
  std::unique_ptr<optim::LossScaler> scaler_;  // fp16 only
  // By chunk, from keepSquares until finish(): whether its sums were kept, and they (the whole sum, or
  // under tensor parallelism the slices' and the whole parameters').
  std::vector<bool> kept_;
  std::vector<std::array<Tensor, 2>> keptSquares_;
};

}  // namespace strata::train
