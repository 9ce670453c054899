#include "train/ShardedUpdate.h"

#include <cmath>

#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"
#include "strata/distributed/ProcessGroup.h"
#include "strata/ops/Ops.h"
#include "strata/optim/AdamW.h"

namespace strata::train {

ShardedUpdate::ShardedUpdate(ModelState& state, const config::Config& c, DType compute)
    : state_(state), device_(state.device), clipGrad_(c.optimizer.clipGrad) {
  if (compute == DType::F16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});
}

StepEnd ShardedUpdate::finish(const std::vector<Tensor>& grads, Tensor stepLoss, double lr) {
  StepEnd end;
  double scale = lossScale();
  // The squared norm over this rank's shard of every chunk, summed over the ranks in rank order: the same
  // pieces, so the same bits, at every stage.
  Tensor sumSq;
  if (state_.tensor.active()) {
    sumSq = tensorParallelSquares(grads, stepLoss);
  } else {
    sumSq = shardSquares(grads);
    reduceOverRanks(sumSq, stepLoss);
  }
  if (state_.pipelineGroup) reduceOverStages(sumSq, stepLoss);
  kept_.assign(kept_.size(), false);
  keptSquares_.assign(keptSquares_.size(), {});
  end.loss = std::move(stepLoss);
  end.sumSq = std::move(sumSq);
  end.norm = ops::sqrt(end.sumSq);
  profiler::mark("grad norm");
  decide(scale, end);
  StepOutcome& outcome = end.outcome;
  if (outcome.applied) {
    state_.optimizer->stepChunks(lr, grads, end.coef);
    outcome.offloadSeconds = state_.optimizer->offDeviceSeconds();
    outcome.offloadPhases = state_.optimizer->offloadPhases();
    // Each rank updated its shard of the 16-bit parameters: gather the chunks whole again.
    if (state_.stage == 1 || state_.stage == 2) gatherShards();
  }
  profiler::mark("optimizer step");
  return end;
}

void ShardedUpdate::reduceOverRanks(Tensor& sumSq, Tensor& stepLoss) const {
  if (!state_.groups.communicates()) return;
  Tensor both = ops::cat({sumSq.view({1}), stepLoss.view({1})}, 0);
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  state_.groups.comm().allReduce(both);
  streamWaits(currentStream(device_), commStream, device_);
  sumSq = both.narrow(0, 0, 1).view({});
  stepLoss = both.narrow(0, 1, 1).view({});
}

void ShardedUpdate::reduceOverStages(Tensor& sumSq, Tensor& stepLoss) const {
  Tensor both = ops::cat({sumSq.reshape({1}), stepLoss.reshape({1})}, 0);
  const Stream& commStream = deviceStreams(device_).comm;
  streamWaits(commStream, currentStream(device_), device_);
  state_.pipelineGroup->communicator().allReduce(both);
  streamWaits(currentStream(device_), commStream, device_);
  sumSq = both.narrow(0, 0, 1).view({});
  stepLoss = both.narrow(0, 1, 1).view({});
}

Tensor ShardedUpdate::tensorParallelSquares(const std::vector<Tensor>& grads, Tensor& stepLoss) const {
  Tensor sliced = shardSquares(grads, true), whole = shardSquares(grads, false);
  Tensor all = ops::cat({sliced.view({1}), whole.view({1}), stepLoss.view({1})}, 0);
  if (state_.groups.communicates()) {
    const Stream& commStream = deviceStreams(device_).comm;
    streamWaits(commStream, currentStream(device_), device_);
    state_.groups.comm().allReduce(all);
    streamWaits(currentStream(device_), commStream, device_);
  }
  Tensor slicedSum = all.narrow(0, 0, 1).contiguous();
  state_.tensor.allReduceSum(slicedSum);  // ordered with the compute stream by the trainer's function
  stepLoss = all.narrow(0, 2, 1).view({});
  return ops::add(slicedSum, all.narrow(0, 1, 1)).view({});
}

void ShardedUpdate::decide(double scale, StepEnd& end) {
  StepOutcome& outcome = end.outcome;
  // NOTE [Step-end decision]: one host read decides the step. The next step's data is staged synchronously
  // anyway, so this costs no overlap.
  outcome.loss = end.loss.item();
  double scaledNorm = end.norm.item();
  outcome.finite = std::isfinite(outcome.loss) && std::isfinite(scaledNorm);
  outcome.gradNorm = scaledNorm / scale;
  if (scaler_) {
    if (scaler_->update(outcome.finite ? scaledNorm : NAN)) {
      // Unscale and clip in one factor handed to the fused update.
      double c = 1.0 / scale;
      if (clipGrad_ > 0 && outcome.gradNorm > clipGrad_) c *= clipGrad_ / (outcome.gradNorm + 1e-6);
      end.coef = ops::full({}, c, DType::F32, device_);
      outcome.applied = true;
    }
    outcome.lossScale = scaler_->scale();
  } else if (outcome.finite) {
    if (clipGrad_ > 0) end.coef = optim::clipCoefficient(end.norm, clipGrad_);
    outcome.applied = true;
  }
}

void ShardedUpdate::gatherShards() {
  const zero::ChunkGroups& groups = state_.groups;
  if (!groups.communicates()) return;
  // On the gather lane (NOTE [Collective lanes] in distributed/Communicator.h).
  const Stream& gatherStream = deviceStreams(device_).gather;
  streamWaits(gatherStream, currentStream(device_), device_);
  for (size_t c = 0; c < state_.chunks->numChunks(); ++c) {
    if (!groups.communicates(c)) continue;
    zero::ShardRange r = groups.shard(c);
    Tensor full = state_.chunks->paddedFlat(c);
    groups.comm(c).allGather(full, full.narrow(0, r.begin, r.size()));
  }
  streamWaits(currentStream(device_), gatherStream, device_);
}

Tensor ShardedUpdate::chunkSquares(size_t c, const Tensor& grads, std::optional<bool> slices) const {
  // The pieces of the parameters inside this rank's shard of the chunk, in layout order; `grads` holds the
  // whole (padded) chunk's gradients or just the shard's. 16-bit gradient buffers
  // (precision.grad_accum_dtype) are widened to fp32 here, one chunk at a time.
  const zero::ChunkLayout& layout = state_.chunks->layout();
  zero::ShardRange r = state_.groups.shard(c);
  int64_t base = grads.numel() == r.size() ? r.begin : 0;
  Tensor g = grads.dtype() != DType::F32 ? ops::to(grads, grads.device(), DType::F32) : grads;
  std::vector<Tensor> pieces;
  for (int64_t k : layout.chunks[c].slots) {
    if (slices && state_.sliceSlots[size_t(k)] != *slices) continue;
    if (!state_.tiedCopySlots.empty() && state_.tiedCopySlots[size_t(k)]) continue;
    const zero::ChunkSlot& slot = layout.slots[size_t(k)];
    int64_t a = std::max(slot.offset, r.begin), b = std::min(slot.offset + slot.numel, r.end);
    if (a < b) pieces.push_back(g.narrow(0, a - base, b - a));
  }
  return pieces.empty() ? Tensor() : ops::sumOfSquaresParts(pieces);
}

void ShardedUpdate::keepSquares(size_t c, const Tensor& grads) {
  size_t n = state_.chunks->numChunks();
  kept_.resize(n, false);
  keptSquares_.resize(n);
  auto keep = [&](std::optional<bool> slices) {
    Tensor sum = chunkSquares(c, grads, slices);
    // Made on the caller's stream (the comm stream), read on the compute stream at the step's end.
    if (sum.defined()) sum.storage()->recordStream(deviceStreams(device_).compute);
    return sum;
  };
  if (state_.tensor.active())
    keptSquares_[c] = {keep(true), keep(false)};
  else
    keptSquares_[c] = {keep(std::nullopt), Tensor()};
  kept_[c] = true;
}

Tensor ShardedUpdate::shardSquares(const std::vector<Tensor>& grads, std::optional<bool> slices) const {
  // One sum over every chunk's partial sums, in chunk order: the bits of one sumOfSquares over all the
  // pieces, wherever each chunk's partials were taken.
  std::vector<Tensor> parts;
  for (size_t c = 0; c < grads.size(); ++c) {
    bool kept = c < kept_.size() && kept_[c];
    STRATA_CHECK(kept || grads[c].device() == device_,
                 "chunk {}: its gradients left the device without their norm's terms", c);
    Tensor part = kept ? keptSquares_[c][slices == std::optional<bool>(false) ? 1 : 0]
                       : chunkSquares(c, grads[c], slices);
    if (part.defined()) parts.push_back(part);
  }
  return parts.empty() ? ops::zeros({}, DType::F32, device_) : ops::sumParts(parts);
}

void ShardedUpdate::saveScaler(StepEngineState& s) const {
  if (!scaler_) return;
  s.lossScale = scaler_->scale();
  s.lossScaleGoodSteps = scaler_->goodSteps();
}

void ShardedUpdate::restoreScaler(const StepEngineState& s) {
  if (scaler_ && s.lossScale > 0) scaler_->restore(s.lossScale, s.lossScaleGoodSteps);
}

}  // namespace strata::train
