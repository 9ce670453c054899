// The step engine: one optimizer step of a model, from micro-batches to updated weights.
//
// The training loop (Trainer) owns data, the schedule, logging, evaluation and checkpoints; a StepEngine owns
// everything inside a step: forward and backward per micro-batch, the global gradient norm, the decision that
// the step may be applied (finite loss and norm; fp16's loss scale), the update with its clipping
// coefficient, and zeroing the gradients. ZeroStepEngine is the step over chunks on N ranks (N = 1 included)
// with all state on the ranks' devices; the store and pipelined-optimizer engines implement the same
// interface.
//
// NOTE [Step-end decision]
// Clipping needs the global gradient norm and fp16 needs to know whether any gradient overflowed; both are
// known only when the last gradient of the step is complete. Strata decides them in a two-phase step:
//   1. During backward, as each chunk's gradients complete, they are reduced (ZeRO) in their device buffers:
//      all-reduced at stages 0 and 1, reduce-scattered at stages 2 and 3 into this rank's fp32 shard, the
//      full buffer freed at once. They stay on the device until the update, where a chunk whose optimizer
//      state is off the device has its gradients streamed to the host piece by piece (NOTE [Pipelined
//      update] in optim/AdamW.h), so `strata plan` counts every buffer (stages 0 and 1) or shard (2 and 3)
//      in the device's memory at the update; unless they have a home in host memory (stages 0 and 3, NOTE
//      [Gradient homes] in zero/GradientReducer.h): then the chunk's terms of the norm are taken on the
//      device and the gradients leave for the host at once, freeing their buffer. Nothing is updated yet.
//   2. When backward ends, one reduction of the per-chunk partial sums gives the global norm and the overflow
//      flag (one host read per step). A non-finite step is skipped with every state untouched; otherwise the
//      clip coefficient is fixed and the updates are issued chunk by chunk in first-use order: GPU-resident
//      chunks on the GPU, host chunks on the CPU workers. The next step's forward starts as soon as its first
//      chunks are updated, so the update of chunk k overlaps the forward of chunks < k.
// Why not the alternatives: a speculative update with rollback must keep a copy of the master and both
// moments (12 bytes per parameter) of every chunk it touched, and clipping is active in most early steps,
// so the rollback would be the common path; a one-step-delayed decision applies step t's clip or skip to
// step t + 1, so a skipped fp16 step would already have changed the weights. The two-phase step is exact: it
// gives the numbers of the plain sequential step, which the tests compare bitwise. The opt-in delayed update
// of SSD-resident state (store.delayed_update) is the one documented exception.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "strata/autograd/Fp8.h"
#include "strata/config/Config.h"
#include "strata/data/Objective.h"
#include "strata/optim/ChunkOptimizer.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/MicroBatchSchedule.h"
#include "strata/train/PipelineSchedule.h"
#include "strata/zero/ChunkArena.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/Store.h"

namespace strata::dist {
class ProcessGroup;
}  // namespace strata::dist

namespace strata::zero {
class GradientReducer;
class ParameterGatherer;
}  // namespace strata::zero

namespace strata::train {

// What one step did, read on the host.
struct StepOutcome {
  double loss = 0;       // mean loss over the micro-batches (NaN when not finite)
  double gradNorm = 0;   // global L2 norm of the unscaled gradients
  bool finite = true;    // loss and gradient norm were finite
  bool applied = false;  // the update ran (false: skipped, every state untouched)
  double lossScale = 1;  // fp16's loss scale after the step (1 otherwise)
  // Seconds the step spent updating optimizer state off the device (gradients out, the CPU update, SSD reads
  // and writes, parameters back): the device waits for all of it until the pipelined optimizer.
  double offloadSeconds = 0;
  optim::OffloadPhases offloadPhases;  // the same by phase
};

// The engine's counters a checkpoint keeps, beside its tensors.
struct StepEngineState {
  int64_t optimizerSteps = 0;
  double lossScale = 0;  // 0: no loss scaler
  int64_t lossScaleGoodSteps = 0;
};

// Hands out the micro-batches of one step, in order.
using MicroBatchSource = std::function<data::TokenBatch()>;

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // One step at learning rate `lr` over `microBatches` micro-batches drawn from `next` (this rank's share of
  // the global batch).
  virtual StepOutcome step(const MicroBatchSource& next, int64_t microBatches, double lr) = 0;
  // This rank's part of the model state and of the optimizer state as checkpoint pieces (NOTE [Sharded
  // chunk checkpoints] in train/Checkpoint.h): views into the live state, no collective; every rank saves
  // its own.
  virtual SaveTensors checkpointModel() const = 0;
  virtual SaveTensors checkpointOptimizer() const = 0;
  // Loads this rank's state from a checkpoint of any world size and chunk size with the same parameters:
  // the parameters and masters, and the optimizer's moments when `optimizer`. No collective.
  virtual void loadState(ChunkCheckpointReader& reader, bool optimizer) = 0;
  virtual StepEngineState state() const = 0;
  virtual void restore(const StepEngineState& state) = 0;
  virtual const zero::ChunkManager& chunks() const = 0;
  // The layout a checkpoint's manifest records: chunks().layout(), and under expert parallelism the expert
  // chunks of every expert-parallel rank too (NOTE [Expert-parallel checkpoints] in
  // src/train/CheckpointPieces.h).
  virtual const zero::ChunkLayout& checkpointLayout() const = 0;
  // Bytes of model state this rank holds between steps: parameters, masters and optimizer moments.
  virtual size_t modelStateBytes() const = 0;
};

// Moves the objective's model's parameters into chunks of `chunkBytes` of `compute` dtype (padded for
// `shards` ranks), in the first-use order that one traced loss of one sequence records (in eval mode, the
// RNG untouched).
// `hostMasterBytes`: 16-bit chunks' fp32 masters are made in host memory while their running total, in chunk
// order, stays within it, the rest on the device (a model too large for its masters and chunks to share the
// device; 0: every master on the device).
// `families`: the parameters kept in chunks of their own, sharded over other ranks (expert parallelism).
// `sharded`: of a model built with deferred parameters, this rank's shards only (NOTE [Sharded layout] in
// zero/ChunkManager.h).
std::unique_ptr<zero::ChunkManager> layOutModelChunks(data::Objective& objective, Device device,
                                                      DType compute, int64_t chunkBytes, int shards = 1,
                                                      uint64_t hostMasterBytes = 0,
                                                      const zero::ChunkFamilies& families = {},
                                                      const std::optional<zero::ShardedLayout>& sharded = {});

// The step over the chunks of the objective's model on the ranks of `group` (null: one rank), each
// micro-batch's loss from the objective (NOTE [Training objectives] in data/Objective.h): ZeRO stage
// zero_optimization.stage over chunks, AdamW or Adafactor (optimizer.type), clipping from
// optimizer.clip_grad, and for fp16 dynamic loss scaling from the precision section. One rank is the same
// path with N = 1.
// - The constructor lays the model out in chunks (layOutModelChunks) in the compute dtype, padded to equal
//   shards, with fp32 gradient buffers (or 16-bit ones: precision.grad_accum_dtype) and, for 16-bit
//   compute, fp32 masters; every rank starts from rank 0's weights. Numbers do not depend on the layout. The
//   model passed in holds fp32 parameters; afterwards it holds compute-dtype views into the chunks.
// - Stage 0: every rank keeps all optimizer state; each chunk's gradients are all-reduced as soon as they
//   are complete in the step's last backward (NOTE [Chunk gradients complete]), overlapping the rest of it.
// - Stage 1: each rank keeps the masters and moments of its shard of every chunk, updates that shard and
//   all-gathers the 16-bit chunks after the update.
// - Stage 2: as 1, and each chunk's gradients are reduce-scattered into this rank's fp32 shard as soon as
//   they are complete, and the chunk's full gradient buffer is released at once.
// - Stage 3: as 2, and each rank keeps only its shard of the parameters as well; chunks are gathered whole
//   while the modules that use them run (NOTE [Parameter gathering] in zero/ParameterGatherer.h).
// The norm is summed over each rank's shard pieces in a fixed order, so stages 0, 1 and 2 give the same
// numbers bit for bit at one world size (CPU; NCCL's sums have an order of their own).
// Expert parallelism (NOTE [Expert parallelism] in nn/MoE.h): the experts of MoE layers split over an
// expert-parallel group live in chunks of their own (zero::ChunkFamilies), which ZeRO shards, reduces and
// gathers over `expertDataGroup` (the ranks holding the same experts) instead of `group`; every other step
// of the engine is the same. Their gradients, summed over that group, are the global batch's too: each
// rank's experts saw the tokens of its whole expert-parallel group.
// Tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): `group` is the data-parallel group
// (the ranks holding the same slices); the gradient norm adds the slices' squares over the model's
// tensor-parallel group and counts the whole parameters once.
// How many ranks share this rank's host and device (NOTE [Per-node shares] in distributed/Launch.h): the
// engine sizes its automatic budgets from its share of the device's memory and of the host's memory and disk.
struct RankShares {
  int ranksOnHost = 1;
  int ranksOnDevice = 1;
  // The device budget the trainer's plan gave store.gpu_budget_gb auto (plan/Plan.h; 0: no plan): the
  // placement starts within it, and the memory tracer, where it runs, refines it from the first step.
  uint64_t plannedDeviceBudget = 0;
};

// Pipeline parallelism (NOTE [Pipeline stages] in nn/Pipeline.h, NOTE [Pipeline schedules] in
// train/PipelineSchedule.h): the model is one stage's part of a split model (an nn::PipelineStageModel);
// `stages` is the pipeline-parallel group, `embedding` the two ranks holding the tied embedding (null
// elsewhere). Each step runs the pipeline schedule instead of the micro-batch schedule, sums the tied
// embedding's gradients over `embedding`, then hands every chunk to the data-parallel reduction; the norm and
// the loss are summed over the stages. `group` is this stage's data-parallel group.
struct PipelineGroups {
  dist::ProcessGroup* stages = nullptr;
  dist::ProcessGroup* embedding = nullptr;
};

// NOTE [Step engine parts]
// ZeroStepEngine composes parts that each have one reason to change (docs/design.md has the table of who
// owns which state and runs on which stream):
// - the start-up (src/train/ModelState.h): the chunks, the start-up broadcast, the shards this rank keeps,
//   the store's placement, the SSD tier and the optimizer; it ends in ModelState, where every byte of this
//   rank's model state lives, and after a traced first step promotes optimizer state onto the device;
// - zero::GradientReducer: each chunk's gradients reduced as they complete, per stage, on the comm stream;
// - ShardedUpdate (src/train/ShardedUpdate.h): the norm, the step-end decision with fp16's loss scale, the
//   optimizer's update and, at stages 1 and 2, the gathers of the updated parameters;
// - zero::ParameterGatherer (stage 3, and chunks whose parameters are homed off the device: NOTE
//   [Parameter homes] in zero/ParameterGatherer.h): module hooks, gather slots and prefetch on the gather
//   stream;
// - CheckpointPieces (src/train/CheckpointPieces.h): the state as checkpoint pieces, and their load;
// - a MicroBatchSchedule: which micro-batch runs forward and backward when.
// step() is the step itself: the schedule runs each micro-batch's forward and backward, the reducer hands
// over the reduced gradients, and the update ends the step.
struct ModelState;
class ShardedUpdate;
class CheckpointPieces;

class ZeroStepEngine final : public StepEngine {
 public:
  ZeroStepEngine(data::Objective& objective, const config::Config& config, Device device, DType compute,
                 dist::ProcessGroup* group = nullptr, dist::ProcessGroup* expertDataGroup = nullptr,
                 RankShares shares = {}, PipelineGroups pipeline = {});
  ~ZeroStepEngine() override;
  StepOutcome step(const MicroBatchSource& next, int64_t microBatches, double lr) override;
  SaveTensors checkpointModel() const override;
  SaveTensors checkpointOptimizer() const override;
  void loadState(ChunkCheckpointReader& reader, bool optimizer) override;
  StepEngineState state() const override;
  void restore(const StepEngineState& state) override;
  const zero::ChunkManager& chunks() const override;
  const zero::ChunkLayout& checkpointLayout() const override;
  size_t modelStateBytes() const override;
  // Where this rank's model state lives, bytes per tier (NOTE [Store placement] in zero/Store.h).
  const zero::StorePlacement& placement() const;
  // The gradient reduction over the data-parallel group (what it sends, PowerSGD's state).
  const zero::GradientReducer& gradientReducer() const;
  // The optimizer over the chunks: AdamW or Adafactor (optimizer.type).
  const optim::ChunkOptimizer& optimizer() const;
  // Stage 3: the most chunks gathered at once so far, and the arenas they are gathered into, one per slot
  // class (zero::planChunkArena; none below stage 3 or with store.arena off). NOTE [Chunk arena] in
  // zero/ChunkArena.h.
  size_t peakGatheredChunks() const;
  std::vector<const zero::ChunkArena*> arenas() const;
  // FP8 training's scales and histories (NOTE [FP8 training] in autograd/Fp8.h); null without precision.fp8.
  const autograd::Fp8Scaling* fp8() const { return fp8_.get(); }
  // Replaces the order micro-batches run in (SequentialSchedule unless set).
  void setSchedule(std::unique_ptr<MicroBatchSchedule> schedule);
  // On a GPU, after the first step: the most device memory the step held beyond the model state on the device
  // when it began (activations, gradient buffers, gather slots, workspace); 0 before, or on the CPU.
  uint64_t firstStepWorkingBytes() const { return firstStepWorking_; }

 private:
  // One micro-batch's forward, its loss; and its backward from the loss as the step weighs it, `last` for
  // the step's last one.
  Tensor forward(const data::TokenBatch& batch);
  void backward(const Tensor& loss, bool last);
  // The pipeline's part of step(): the schedule over `microBatches` micro-batches from `next`, each
  // weighing `share`, the last stage's losses added into stepLoss; then the tied gradients summed and every
  // chunk announced complete.
  void pipelineStep(const MicroBatchSource& next, int64_t microBatches, double share, Tensor& stepLoss);
  // NOTE [Gradient homes] in zero/GradientReducer.h: which chunks' gradients leave the device as they
  // complete (store.gradient_home), refused where the engine cannot drive them.
  void homeGradients(const config::Config& config);

  data::Objective& objective_;
  Device device_;
  DType compute_;
  bool delayedUpdate_ = false;  // store.delayed_update (NOTE [Delayed SSD update] in optim/AdamW.h)
  int64_t steps_ = 0;
  int64_t powerSgdStart_ = 0;    // dist.powersgd_start_iter
  bool powerSgdLoaded_ = false;  // loadState found PowerSGD's state in the checkpoint
  uint64_t firstStepWorking_ = 0;
  // The parts, in the order the start-up makes them; destroyed in reverse, the model state last.
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<zero::ParameterGatherer> gatherer_;  // stage 3, or parameters homed off the device
  std::unique_ptr<zero::GradientReducer> reducer_;
  std::unique_ptr<ShardedUpdate> update_;
  std::unique_ptr<CheckpointPieces> checkpoint_;
  std::unique_ptr<MicroBatchSchedule> schedule_;
  nn::PipelineStageModel* stages_ = nullptr;  // the model as a pipeline stage, under a pipeline
  std::unique_ptr<PipelineSchedule> pipeline_;
  // precision.fp8: every Linear layer's FP8 state, updated at the end of each step and saved with the
  // optimizer state as piece "fp8.<fp8Index_>@0" (one per rank).
  std::shared_ptr<autograd::Fp8Scaling> fp8_;
  int64_t fp8Index_ = 0;
};

}  // namespace strata::train
