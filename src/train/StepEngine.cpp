#include "strata/train/StepEngine.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
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
                                    c.optimizer.eps, c.optimizer.weightDecay}) {
  if (compute_ != DType::F32) keepComputeCopies(params_, c.precision.weightCopies);
  if (compute_ == DType::F16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});
}

StepOutcome LocalStepEngine::step(const MicroBatchSource& next, int64_t microBatches, double lr) {
  StepOutcome outcome;
  Tensor stepLoss = ops::zeros({}, DType::F32, device_);
  double scale = scaler_ ? scaler_->scale() : 1.0;
  for (int64_t micro = 0; micro < microBatches; ++micro) {
    auto [x, y] = next();
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
