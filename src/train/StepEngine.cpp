#include "strata/train/StepEngine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/autograd/Engine.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/core/Allocator.h"
#include "strata/core/Error.h"
#include "strata/core/Profiler.h"
#include "strata/core/Stream.h"
#include "strata/distributed/Communicator.h"
#include "strata/distributed/ProcessGroup.h"
#include "strata/nn/Linear.h"
#include "strata/ops/Ops.h"
#include "strata/zero/GradientReducer.h"
#include "strata/zero/ParameterGatherer.h"
#include "train/CheckpointPieces.h"
#include "train/ModelState.h"
#include "train/ShardedUpdate.h"

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

ZeroStepEngine::ZeroStepEngine(data::Objective& objective, const config::Config& c, Device device,
                               DType compute, dist::ProcessGroup* group, dist::ProcessGroup* expertDataGroup,
                               RankShares shares, PipelineGroups pipeline)
    : objective_(objective),
      device_(device),
      compute_(compute),
      delayedUpdate_(c.store.delayedUpdate),
      state_(std::make_unique<ModelState>(
          layOutModelState(objective, c, device, compute, group, expertDataGroup, shares))) {
  ModelState& s = *state_;
  if (pipeline.stages) {
    // NOTE [Pipeline stages] in nn/Pipeline.h.
    stages_ = dynamic_cast<nn::PipelineStageModel*>(&objective.model());
    STRATA_CHECK(
        stages_ != nullptr && stages_->pipeline().active() &&
            stages_->pipeline().size == pipeline.stages->size(),
        "ZeroStepEngine: a pipeline group of {} ranks for a model that is not split into as many stages",
        pipeline.stages->size());
    STRATA_USER_CHECK(s.stage <= 2,
                      "parallel.pipeline ({}) with zero_optimization.stage 3 is not supported (each stage "
                      "gathers its parameters over its data-parallel ranks module by module, which the "
                      "pipeline's schedule does not drive): set zero_optimization.stage to 0, 1 or 2",
                      pipeline.stages->size());
    s.pipeline = stages_->pipeline();
    s.pipelineGroup = pipeline.stages;
    s.embeddingGroup = pipeline.embedding;
    if (s.pipeline.holdsLast() && !s.pipeline.holdsFirst()) {
      std::vector<std::string> tied = stages_->tiedParameters();
      for (const zero::ChunkSlot& slot : s.chunks->layout().slots)
        s.tiedCopySlots.push_back(std::find(tied.begin(), tied.end(), slot.name) != tied.end());
    }
    pipeline_ = std::make_unique<PipelineSchedule>(pipeline.stages->communicator(), s.pipeline);
  }
  placeModelState(s, c, compute, shares);
  // Stage 3, and parameters homed off the device (NOTE [Parameter homes] in zero/ParameterGatherer.h), evict
  // the chunks they gather before any optimizer state takes device memory.
  if (s.gathers())
    gatherer_ = std::make_unique<zero::ParameterGatherer>(
        *s.chunks, s.groups, s.parameterShards, objective.model(), device, c.zero.prefetchDepth,
        c.store.arena, s.placement.parameterTier, /*acrossRanks=*/s.stage == 3, s.nvme.get());
  makeChunkOptimizer(s, c);
  if (c.dist.powersgdRank > 0 && s.stage >= 2)
    STRATA_USER_FAIL(
        "dist.powersgd_rank: {} needs ZeRO stage 0 or 1 (zero_optimization.stage is {}: stages 2 and 3 "
        "reduce-scatter the gradients into shards, and PowerSGD's factors are all-reduced); set "
        "zero_optimization.stage to 0 or 1, or dist.powersgd_rank to 0",
        c.dist.powersgdRank, s.stage);
  powerSgdStart_ = c.dist.powersgdStartIter;
  reducer_ = std::make_unique<zero::GradientReducer>(
      *s.chunks, s.groups, s.stage, device,
      zero::PowerSgdOptions{c.dist.powersgdRank, c.dist.powersgdStartIter, c.train.seed});
  update_ = std::make_unique<ShardedUpdate>(s, c, compute);
  homeGradients(c);
  checkpoint_ = std::make_unique<CheckpointPieces>(s);
  schedule_ = std::make_unique<SequentialSchedule>();
  if (c.precision.fp8) {
    // NOTE [FP8 training] in autograd/Fp8.h. Each rank keeps the scales of what it saw, saved under its
    // place in the pipeline, tensor-parallel and data-parallel groups.
    fp8_ = nn::enableFp8(objective.model(),
                         autograd::Fp8Recipe{c.precision.fp8AmaxHistory, c.precision.fp8Margin,
                                             c.precision.fp8AmaxCompute == "most_recent"},
                         device, c.precision.fp8LmHead);
    fp8Index_ =
        (int64_t(s.pipeline.rank) * s.tensor.size + s.tensor.rank) * s.groups.ranks() + s.groups.rank();
  }
  memlog(device_, "engine built", 0);
}

ZeroStepEngine::~ZeroStepEngine() = default;

void ZeroStepEngine::homeGradients(const config::Config& c) {
  const ModelState& s = *state_;
  const std::string& setting = c.store.gradientHome;
  if (setting == "device") return;
  bool host = setting == "host";
  std::string whyNot;
  if (s.stage != 0 && s.stage != 3)
    whyNot = detail::format("zero_optimization.stage is {} (they need stage 0 or 3)", s.stage);
  else if (s.pipeline.active())
    whyNot = "parallel.pipeline is set (a pipeline's chunks complete after its schedule, outside backward)";
  else if (c.dist.powersgdRank > 0)
    whyNot = "dist.powersgd_rank is set (PowerSGD's factors are summed in the gradients' place)";
  if (!whyNot.empty()) {
    STRATA_USER_CHECK(!host,
                      "store.gradient_home is host, but gradients cannot leave the GPU here: {}; set "
                      "store.gradient_home to auto (they stay on the GPU here) or device",
                      whyNot);
    return;
  }
  // host: every chunk whose optimizer state is off the device; auto: those whose parameters are homed off
  // it too (the placement found the device budget short). Asked at each chunk's reduction: the memory
  // tracer may have moved the chunk's state onto the device since the start.
  const ModelState* state = state_.get();
  ShardedUpdate* update = update_.get();
  reducer_->setGradientHomes(
      [state, host](size_t chunk) {
        if (state->optimizer->home(chunk) == zero::Tier::Device) return false;
        return host || state->placement.parameterHome(chunk) != zero::Tier::Device;
      },
      [update](size_t chunk, const Tensor& grads) { update->keepSquares(chunk, grads); },
      c.zero.pinMemory && device_.isCuda());
}

StepOutcome ZeroStepEngine::step(const MicroBatchSource& next, int64_t microBatches, double lr) {
  // The first step's peak: what the memory tracer and the trainer's check of the plan read after it.
  bool measureFirst = steps_ == 0 && device_.isCuda();
  uint64_t stateOnDevice = state_->placement.bytes[int(zero::Tier::Device)];
  if (measureFirst || (state_->traced && steps_ == 0)) deviceAllocator(device_).resetPeakStats();
  Tensor stepLoss = ops::zeros({}, DType::F32, device_);
  // Every micro-batch of every rank counts 1 / (micro-batches x ranks): the gradients' sum over ranks is the
  // global batch's mean gradient.
  double share = 1.0 / double(microBatches * state_->groups.ranks());
  if (pipeline_) {
    pipelineStep(next, microBatches, share, stepLoss);
  } else {
    // What each micro-batch's forward made, its data and its loss, kept until its backward has run.
    struct InFlight {
      data::TokenBatch batch;
      Tensor loss;
    };
    std::vector<InFlight> inFlight(static_cast<size_t>(microBatches));
    int64_t backwards = 0;
    MicroBatchWork work;
    work.forward = [&](int64_t micro) {
      InFlight& f = inFlight[size_t(micro)];
      f.batch = next();
      profiler::mark("data");
      f.loss = forward(f.batch);
      return share != 1.0 ? f.loss * share : f.loss;
    };
    work.backward = [&](int64_t micro, const Tensor& scaled) {
      backward(scaled, ++backwards == microBatches);
      NoGradGuard noGrad;
      stepLoss = ops::add(stepLoss, ops::to(scaled.detach(), device_, DType::F32));
      profiler::mark("loss bookkeeping");
      inFlight[size_t(micro)] = InFlight{};
    };
    schedule_->run(microBatches, work);
  }
  NoGradGuard noGrad;
  // The gradients and the step end's device values stay allocated until the step returns (StepEnd).
  std::vector<Tensor> grads = reducer_->finish();
  // NOTE [Gradient homes]: the device bytes of the gradients that left it, for the memory tracer.
  std::vector<uint64_t> gradientsBack(grads.size(), 0);
  for (size_t c = 0; c < grads.size(); ++c)
    if (reducer_->onHost(c)) gradientsBack[c] = uint64_t(grads[c].nbytes());
  // NOTE [Parameter homes]: the update writes the homes off the device, which the gathers may still read.
  if (gatherer_) gatherer_->homesWritable();
  StepEnd end = [&] {
    MemoryPurpose purpose("the optimizer step");
    return update_->finish(grads, std::move(stepLoss), lr);
  }();
  if (!end.outcome.finite) reducer_->dropPowerSgdState();
  // Delayed scaling's step: the amaxes this step recorded give the next step's scales (NOTE [FP8 training]).
  if (fp8_) fp8_->update();
  reducer_->release();
  profiler::mark("zero grad");
  memlog(device_, "update", ++steps_);
  if (measureFirst) {
    uint64_t peak = deviceAllocator(device_).stats().peakAllocatedBytes;
    firstStepWorking_ = peak > stateOnDevice ? peak - stateOnDevice : 0;
  }
  if (state_->traced && steps_ == 1) {
    promoteTracedState(*state_, gradientsBack);
    // A moved chunk's pending parameters went into this rank's shard only: every rank gathers the chunks
    // again (the same collectives on every rank, whatever each one moved).
    if (delayedUpdate_ && (state_->stage == 1 || state_->stage == 2)) update_->gatherShards();
  }
  return end.outcome;
}

void ZeroStepEngine::pipelineStep(const MicroBatchSource& next, int64_t microBatches, double share,
                                  Tensor& stepLoss) {
  // Every stage draws the step's micro-batches alike: the first reads their ids, the last their targets.
  std::vector<data::TokenBatch> batches;
  auto batchOf = [&](int64_t micro) -> const data::TokenBatch& {
    while (int64_t(batches.size()) <= micro) {
      batches.push_back(next());
      profiler::mark("data");
    }
    return batches[size_t(micro)];
  };
  const nn::PipelineParallel& pp = state_->pipeline;
  PipelineWork work;
  work.device = device_;
  work.dtype = compute_;
  work.activationShape = stages_->stageActivationShape(batchOf(0).ids.shape());
  work.forward = [&](int64_t local, int64_t micro, const Tensor& input) {
    const data::TokenBatch& batch = batchOf(micro);
    MemoryPurpose purpose("the activations of a micro-batch's forward");  // NOTE [Out of memory]
    Tensor out = stages_->stageForward(local, input, batch.ids, batch.targets, compute_);
    if (pp.chunkOf(local) != pp.chunks() - 1) return out;
    Tensor scaled = share != 1.0 ? out * share : out;
    NoGradGuard noGrad;
    stepLoss = ops::add(stepLoss, ops::to(scaled.detach(), device_, DType::F32));
    return scaled;
  };
  work.backward = [&](int64_t, const Tensor& input, const Tensor& output, const Tensor& outputGrad) {
    MemoryPurpose purpose("a micro-batch's backward (activation gradients and gradient buffers)");
    state_->chunks->beginBackward(false);
    if (outputGrad.defined()) {
      strata::backward({output}, {outputGrad});
    } else {
      // fp16: scale the loss so small gradients stay representable; the update unscales them.
      strata::backward(update_->scalesLoss() ? output * update_->lossScale() : output);
    }
    if (!input.defined()) return Tensor();
    NoGradGuard noGrad;
    return input.grad().defined() ? input.grad() : ops::zeros(input.shape(), input.dtype(), device_);
  };
  pipeline_->run(microBatches, work);
  NoGradGuard noGrad;
  // The tied embedding's two copies (first and last stage) take the sum of their gradients.
  dist::ProcessGroup* embedding = state_->embeddingGroup;
  if (embedding && embedding->communicator().communicates()) {
    const zero::ChunkLayout& layout = state_->chunks->layout();
    const Stream& commStream = deviceStreams(device_).comm;
    streamWaits(commStream, currentStream(device_), device_);
    for (const std::string& name : stages_->tiedParameters())
      for (size_t k = 0; k < layout.slots.size(); ++k) {
        if (layout.slots[k].name != name) continue;
        const Tensor& grad = state_->chunks->parameters()[k].grad();
        STRATA_CHECK(grad.defined(), "pipeline: the tied parameter '{}' got no gradient", name);
        embedding->communicator().allReduce(grad);
      }
    streamWaits(currentStream(device_), commStream, device_);
  }
  state_->chunks->announceGradientsComplete();
  memlog(device_, "pipeline", steps_ + 1);
}

Tensor ZeroStepEngine::forward(const data::TokenBatch& batch) {
  MemoryPurpose purpose("the activations of a micro-batch's forward");  // NOTE [Out of memory]
  // STRATA_TEST_OOM_AT_STEP=k (a test switch): the first forward of step k fails as a full device would.
  if (const char* k = std::getenv("STRATA_TEST_OOM_AT_STEP"); k && std::atoll(k) == steps_ + 1)
    throw OutOfMemory(deviceAllocator(device_).name(), device_, size_t(1) << 30, "STRATA_TEST_OOM_AT_STEP");
  Tensor loss = objective_.loss(batch, compute_);
  // Backward gathers again, module by module (what was prefetched for it stays).
  if (gatherer_) gatherer_->forwardDone();
  memlog(device_, "forward", steps_ + 1);
  return loss;
}

void ZeroStepEngine::backward(const Tensor& loss, bool last) {
  MemoryPurpose purpose("a micro-batch's backward (activation gradients and gradient buffers)");
  state_->chunks->beginBackward(last);
  // fp16: scale the loss so small gradients stay representable; the update unscales them.
  strata::backward(update_->scalesLoss() ? loss * update_->lossScale() : loss);
  if (gatherer_) gatherer_->backwardDone();
  memlog(device_, "backward", steps_ + 1);
}

SaveTensors ZeroStepEngine::checkpointModel() const {
  return checkpoint_->model();
}

SaveTensors ZeroStepEngine::checkpointOptimizer() const {
  SaveTensors pieces = checkpoint_->optimizer();
  // NOTE [PowerSGD] in zero/PowerSgd.h: once it has run, this rank's Q matrices and error feedback of each
  // chunk, so that a resume continues exactly.
  for (size_t c = 0; c < state_->chunks->numChunks(); ++c) {
    int64_t n = reducer_->powerSgdStateElements(c);
    if (n == 0 || !reducer_->hasPowerSgdState(c)) continue;
    const zero::GradientReducer* reducer = reducer_.get();
    pieces.push_back(
        SaveTensor{chunkPieceName("powersgd", checkpoint_->savedIndex(c), state_->groups.shard(c).begin),
                   {n},
                   DType::F32,
                   [reducer, c] { return reducer->savePowerSgdState(c); }});
  }
  if (fp8_) {
    std::shared_ptr<autograd::Fp8Scaling> fp8 = fp8_;
    pieces.push_back(
        SaveTensor{chunkPieceName("fp8", fp8Index_, 0), {fp8->savedElements()}, DType::F32, [fp8] {
                     return fp8->save();
                   }});
  }
  return pieces;
}

void ZeroStepEngine::loadState(ChunkCheckpointReader& reader, bool optimizer) {
  checkpoint_->load(reader, optimizer);
  // NOTE [FP8 training]: this rank's scales and histories, or (another layout of ranks) the first rank's. A
  // checkpoint without them (saved without precision.fp8) leaves the fresh ones.
  if (fp8_ && optimizer && reader.hasKind("fp8")) {
    std::vector<float> host(size_t(fp8_->savedElements()));
    bool found = reader.readChunkPiece("fp8", fp8Index_, 0, int64_t(host.size()), host.data()) ||
                 reader.readChunkPiece("fp8", 0, 0, int64_t(host.size()), host.data());
    STRATA_USER_CHECK(found,
                      "checkpoint {} holds FP8 scaling state that does not fit this run's {} FP8 layers and "
                      "precision.fp8_amax_history {}: resume with the saved model and settings",
                      reader.directory(), fp8_->layers(), fp8_->recipe().amaxHistory);
    fp8_->load(Tensor::fromVector<float>(host, {int64_t(host.size())}), reader.directory());
  }
  powerSgdLoaded_ = false;
  if (!optimizer || !reader.hasKind("powersgd")) return;
  std::vector<float> host;
  for (size_t c = 0; c < state_->chunks->numChunks(); ++c) {
    int64_t n = reducer_->powerSgdStateElements(c);
    if (n == 0) continue;
    host.resize(size_t(n));
    STRATA_USER_CHECK(
        reader.readChunkPiece("powersgd", checkpoint_->savedIndex(c), state_->groups.shard(c).begin, n,
                              host.data()),
        "checkpoint {} holds PowerSGD state (Q matrices and error feedback) that does not fit this run: it "
        "was "
        "saved at another dist.powersgd_rank, number of data-parallel ranks or chunk size. Resume as it was "
        "saved, or with checkpoint.allow_changes: true and dist.powersgd_rank: 0 (exact reduction from here)",
        reader.directory());
    reducer_->loadPowerSgdState(c, Tensor::fromVector<float>(host, {n}));
    powerSgdLoaded_ = true;
  }
}

StepEngineState ZeroStepEngine::state() const {
  StepEngineState s;
  s.optimizerSteps = state_->optimizer->stepCount();
  update_->saveScaler(s);
  return s;
}

void ZeroStepEngine::restore(const StepEngineState& s) {
  // NOTE [PowerSGD] in zero/PowerSgd.h: past its start, a resume needs the Q matrices and error feedback
  // (loadState) to continue exactly.
  if (reducer_->powerSgdStateBytes() > 0 && s.optimizerSteps > powerSgdStart_ && !powerSgdLoaded_)
    STRATA_USER_FAIL(
        "resuming at optimizer step {} with dist.powersgd_rank, which has run since step {} "
        "(dist.powersgd_start_iter), from a checkpoint without PowerSGD's state (Q matrices and error "
        "feedback): the run would not continue exactly. With checkpoint.allow_changes: true, resume with "
        "dist.powersgd_rank: 0 (exact reduction from here), or dist.powersgd_start_iter: {} or more "
        "(PowerSGD "
        "starts afresh then)",
        s.optimizerSteps, powerSgdStart_, s.optimizerSteps);
  reducer_->setSteps(s.optimizerSteps);
  state_->optimizer->setStepCount(s.optimizerSteps);
  update_->restoreScaler(s);
}

const zero::GradientReducer& ZeroStepEngine::gradientReducer() const {
  return *reducer_;
}

const zero::ChunkManager& ZeroStepEngine::chunks() const {
  return *state_->chunks;
}

const zero::ChunkLayout& ZeroStepEngine::checkpointLayout() const {
  return checkpoint_->layout();
}

size_t ZeroStepEngine::modelStateBytes() const {
  return state_->bytes();
}

const zero::StorePlacement& ZeroStepEngine::placement() const {
  return state_->placement;
}

const optim::ChunkOptimizer& ZeroStepEngine::optimizer() const {
  return *state_->optimizer;
}

size_t ZeroStepEngine::peakGatheredChunks() const {
  return gatherer_ ? gatherer_->peakGathered() : 0;
}

std::vector<const zero::ChunkArena*> ZeroStepEngine::arenas() const {
  return gatherer_ ? gatherer_->arenas() : std::vector<const zero::ChunkArena*>{};
}

void ZeroStepEngine::setSchedule(std::unique_ptr<MicroBatchSchedule> schedule) {
  STRATA_CHECK(schedule != nullptr, "ZeroStepEngine::setSchedule: no schedule");
  schedule_ = std::move(schedule);
}

}  // namespace strata::train
