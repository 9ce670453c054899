#include "strata/train/StepEngine.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Generator.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"

namespace strata::train {

LocalStepEngine::LocalStepEngine(nn::CausalLM& model, const Config& c, Device device, DType compute)
    : model_(model),
      device_(device),
      compute_(compute),
      clipGrad_(c.optimizer.clipGrad),
      params_(model.parameters()),
      optimizer_(model.namedParameters(),
                 optim::AdamWConfig{c.optimizer.lr, c.optimizer.betas[0], c.optimizer.betas[1],
                                    c.optimizer.eps, c.optimizer.weightDecay}),
      chunkBytes_(int64_t(c.zero.chunkSizeMb * double(1 << 20))),
      weightCopies_(c.precision.weightCopies) {
  if (compute_ != DType::F32) keepComputeCopies(params_, c.precision.weightCopies);
  if (compute_ == DType::F16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});
}

void LocalStepEngine::layOutChunks(const Tensor& ids, const Tensor& targets) {
  // One forward in eval mode with the RNG state put back: the trace changes no number of the run.
  GeneratorState rng = defaultGenerator().state();
  bool training = model_.isTraining();
  model_.eval();
  // One sequence is enough: the order of the module calls does not depend on the batch, and the trace's
  // transient memory stays small.
  std::vector<std::string> order = zero::recordFirstUse(model_, [&] {
    NoGradGuard noGrad;
    model_.loss(ids.narrow(0, 0, 1).contiguous(), targets.narrow(0, 0, 1).contiguous(), compute_);
  });
  model_.train(training);
  defaultGenerator().setState(rng);
  // The trace's 16-bit weight copies belong to the storages the move releases: drop them first.
  if (compute_ != DType::F32) {
    keepComputeCopies(params_, false);
    keepComputeCopies(params_, weightCopies_);
  }
  auto named = model_.namedParameters();
  std::vector<std::pair<std::string, Tensor>> ordered;
  for (const auto& name : order)
    for (const auto& [n, p] : named)
      if (n == name) ordered.emplace_back(n, p);
  chunks_ = std::make_unique<zero::ChunkManager>(ordered, chunkBytes_);
}

StepOutcome LocalStepEngine::step(const MicroBatchSource& next, int64_t microBatches, double lr) {
  StepOutcome outcome;
  Tensor stepLoss = ops::zeros({}, DType::F32, device_);
  double scale = scaler_ ? scaler_->scale() : 1.0;
  for (int64_t micro = 0; micro < microBatches; ++micro) {
    auto [x, y] = next();
    if (!chunks_) layOutChunks(x, y);
    profiler::mark("data");
    Tensor loss = model_.loss(x, y, compute_);
    Tensor scaled = microBatches > 1 ? loss * (1.0 / double(microBatches)) : loss;
    // fp16: scale the loss so small gradients stay representable; the update unscales them.
    backward(scaler_ ? scaled * scale : scaled);
    NoGradGuard noGrad;
    stepLoss = ops::add(stepLoss, ops::to(scaled.detach(), device_, DType::F32));
    profiler::mark("loss bookkeeping");
  }
  NoGradGuard noGrad;
  Tensor norm = optim::gradNorm(params_, device_);
  profiler::mark("grad norm");
  // NOTE [Step-end decision]: one host read decides the step. The next step's data is staged synchronously
  // anyway, so this costs no overlap.
  outcome.loss = stepLoss.item();
  double scaledNorm = norm.item();
  outcome.finite = std::isfinite(outcome.loss) && std::isfinite(scaledNorm);
  outcome.gradNorm = scaledNorm / scale;
  if (scaler_) {
    if (scaler_->update(outcome.finite ? scaledNorm : NAN)) {
      // Unscale and clip in one factor handed to the fused update.
      double coef = 1.0 / scale;
      if (clipGrad_ > 0 && outcome.gradNorm > clipGrad_) coef *= clipGrad_ / (outcome.gradNorm + 1e-6);
      optimizer_.step(lr, ops::full({}, coef, DType::F32, device_));
      outcome.applied = true;
    }
    outcome.lossScale = scaler_->scale();
  } else if (outcome.finite) {
    optimizer_.step(lr, clipGrad_ > 0 ? optim::clipCoefficient(norm, clipGrad_) : Tensor());
    outcome.applied = true;
  }
  profiler::mark("optimizer step");
  optimizer_.zeroGrad();
  profiler::mark("zero grad");
  return outcome;
}

StepEngineState LocalStepEngine::state() const {
  StepEngineState s;
  s.optimizerSteps = optimizer_.stepCount();
  if (scaler_) {
    s.lossScale = scaler_->scale();
    s.lossScaleGoodSteps = scaler_->goodSteps();
  }
  return s;
}

void LocalStepEngine::restore(const StepEngineState& s) {
  optimizer_.setStepCount(s.optimizerSteps);
  if (scaler_ && s.lossScale > 0) scaler_->restore(s.lossScale, s.lossScaleGoodSteps);
}

}  // namespace strata::train
