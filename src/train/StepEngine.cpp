#include "strata/train/StepEngine.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Allocator.h"
#include "strata/core/Generator.h"
#include "strata/core/Profiler.h"
#include "strata/ops/Ops.h"

namespace strata::train {

namespace {
// STRATA_MEMLOG=1: the device's allocated and peak bytes at the phases of the first steps (where a peak
// comes from).
void memlog(Device device, const char* phase, int64_t step) {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_MEMLOG");
    return e != nullptr && std::string(e) != "0";
  }();
  if (!on || step > 2) return;
  AllocatorStats st = deviceAllocator(device).stats();
  spdlog::info("memory, step {} {}: allocated {:.2f} GiB, peak {:.2f} GiB", step, phase,
               double(st.allocatedBytes) / double(1 << 30), double(st.peakAllocatedBytes) / double(1 << 30));
}
}  // namespace

LocalStepEngine::LocalStepEngine(nn::CausalLM& model, const Config& c, Device device, DType compute)
    : model_(model), device_(device), compute_(compute), clipGrad_(c.optimizer.clipGrad) {
  if (compute_ == DType::F16)
    scaler_ = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        c.precision.initialLossScale, c.precision.lossScaleWindow, c.precision.minLossScale});
  layOutChunks(int64_t(c.zero.chunkSizeMb * double(1 << 20)));
  optimizer_ = std::make_unique<optim::AdamW>(
      *chunks_, chunks_->takeMasters(),
      optim::AdamWConfig{c.optimizer.lr, c.optimizer.betas[0], c.optimizer.betas[1], c.optimizer.eps,
                         c.optimizer.weightDecay});
  chunks_->onGradientsComplete([this](size_t chunk) { ++chunkNotices_[chunk]; });
  chunkNotices_.assign(chunks_->numChunks(), 0);
  memlog(device_, "engine built", 0);
}

void LocalStepEngine::layOutChunks(int64_t chunkBytes) {
  // The first-use order from one forward of one sequence (token 0 throughout: the order of the module calls
  // does not depend on the data), in eval mode, without gradients, in the parameters' own dtype, with the
  // RNG state put back: the trace changes no number of the run.
  GeneratorState rng = defaultGenerator().state();
  bool training = model_.isTraining();
  model_.eval();
  auto params = model_.parameters();
  STRATA_CHECK(!params.empty(), "the model has no parameters");
  DType source = params.front().dtype();
  int64_t T = std::max<int64_t>(1, model_.contextLength());
  Tensor ids = ops::zeros({1, T}, DType::I64, device_);
  std::vector<std::string> order;
  try {
    order = zero::recordFirstUse(model_, [&] {
      NoGradGuard noGrad;
      model_.loss(ids, ids, source);
    });
  } catch (...) {
    model_.train(training);
    defaultGenerator().setState(rng);
    throw;
  }
  model_.train(training);
  defaultGenerator().setState(rng);
  auto named = model_.namedParameters();
  std::vector<std::pair<std::string, Tensor>> ordered;
  for (const auto& name : order)
    for (const auto& [n, p] : named)
      if (n == name) ordered.emplace_back(n, p);
  chunks_ = std::make_unique<zero::ChunkManager>(ordered, chunkBytes, compute_);
  // The model's old per-parameter storages went back to the caching allocator; return them to the device so
  // the chunks' layout is what the step's activations see.
  if (auto* caching = dynamic_cast<CachingAllocator*>(&deviceAllocator(device_))) caching->emptyCache();
}

StepOutcome LocalStepEngine::step(const MicroBatchSource& next, int64_t microBatches, double lr) {
  StepOutcome outcome;
  Tensor stepLoss = ops::zeros({}, DType::F32, device_);
  double scale = scaler_ ? scaler_->scale() : 1.0;
  for (int64_t micro = 0; micro < microBatches; ++micro) {
    auto [x, y] = next();
    profiler::mark("data");
    Tensor loss = model_.loss(x, y, compute_);
    memlog(device_, "forward", steps_ + 1);
    Tensor scaled = microBatches > 1 ? loss * (1.0 / double(microBatches)) : loss;
    // fp16: scale the loss so small gradients stay representable; the update unscales them.
    chunks_->beginBackward(micro + 1 == microBatches);
    backward(scaler_ ? scaled * scale : scaled);
    memlog(device_, "backward", steps_ + 1);
    NoGradGuard noGrad;
    stepLoss = ops::add(stepLoss, ops::to(scaled.detach(), device_, DType::F32));
    profiler::mark("loss bookkeeping");
  }
  NoGradGuard noGrad;
  // NOTE [Chunk gradients complete]: every chunk heard exactly once in the step's last backward.
  for (size_t c = 0; c < chunkNotices_.size(); ++c) {
    STRATA_CHECK(chunkNotices_[c] == 1, "chunk {}: {} gradient-complete notices in one step", c,
                 chunkNotices_[c]);
    chunkNotices_[c] = 0;
  }
  Tensor norm = optim::gradNorm(chunks_->parameters(), device_);
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
      optimizer_->step(lr, ops::full({}, coef, DType::F32, device_));
      outcome.applied = true;
    }
    outcome.lossScale = scaler_->scale();
  } else if (outcome.finite) {
    optimizer_->step(lr, clipGrad_ > 0 ? optim::clipCoefficient(norm, clipGrad_) : Tensor());
    outcome.applied = true;
  }
  profiler::mark("optimizer step");
  optimizer_->zeroGrad();
  chunks_->releaseGradients();
  profiler::mark("zero grad");
  memlog(device_, "update", ++steps_);
  return outcome;
}

StepEngineState LocalStepEngine::state() const {
  StepEngineState s;
  s.optimizerSteps = optimizer_->stepCount();
  if (scaler_) {
    s.lossScale = scaler_->scale();
    s.lossScaleGoodSteps = scaler_->goodSteps();
  }
  return s;
}

void LocalStepEngine::mastersLoaded() {
  optimizer_->writeParameters();
}

void LocalStepEngine::restore(const StepEngineState& s) {
  optimizer_->setStepCount(s.optimizerSteps);
  if (scaler_ && s.lossScale > 0) scaler_->restore(s.lossScale, s.lossScaleGoodSteps);
}

}  // namespace strata::train
