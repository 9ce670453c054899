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
//   1. During backward, as each chunk's gradients complete, they are reduced (ZeRO), moved to the home tier
//      of their optimizer state, and their squared norm and finiteness are accumulated per chunk. Nothing is
//      updated yet.
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
#include <map>
#include <memory>
#include <utility>

#include "strata/core/Stream.h"
#include "strata/nn/Module.h"
#include "strata/optim/ChunkOptimizer.h"
#include "strata/optim/LossScaler.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Config.h"
#include "strata/train/Objective.h"
#include "strata/zero/ChunkArena.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"
#include "strata/zero/Store.h"

namespace strata::dist {
class Communicator;
class ProcessGroup;
}  // namespace strata::dist

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
using MicroBatchSource = std::function<TokenBatch()>;

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
  // chunks of every expert-parallel rank too (NOTE [Expert-parallel checkpoints] in StepEngine.cpp).
  virtual const zero::ChunkLayout& checkpointLayout() const = 0;
  // Bytes of model state this rank holds between steps: parameters, masters and optimizer moments.
  virtual size_t modelStateBytes() const = 0;
};

// Moves the objective's model's parameters into chunks of `chunkBytes` of `compute` dtype (padded for
// `shards` ranks), in the first-use order that one traced loss of one sequence records (in eval mode, the
// RNG untouched).
// `mastersOnHost`: 16-bit chunks' fp32 masters are made in host memory (a model too large for its masters
// and chunks to share the device).
// `families`: the parameters kept in chunks of their own, sharded over other ranks (expert parallelism).
std::unique_ptr<zero::ChunkManager> layOutModelChunks(Objective& objective, Device device, DType compute,
                                                      int64_t chunkBytes, int shards = 1,
                                                      bool mastersOnHost = false,
                                                      const zero::ChunkFamilies& families = {});

// The step over the chunks of the objective's model on the ranks of `group` (null: one rank), each
// micro-batch's loss from the objective (NOTE [Training objectives] in Objective.h): ZeRO stage
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
//   while the modules that use them run (NOTE [Parameter gathering] in StepEngine.cpp).
// The norm is summed over each rank's shard pieces in a fixed order, so stages 0, 1 and 2 give the same
// numbers bit for bit at one world size (CPU; NCCL's sums have an order of their own).
// Expert parallelism (NOTE [Expert parallelism] in nn/MoE.h): the experts of MoE layers split over an
// expert-parallel group live in chunks of their own (zero::ChunkFamilies), which ZeRO shards, reduces and
// gathers over `expertDataGroup` (the ranks holding the same experts) instead of `group`; every other step
// of the engine is the same. Their gradients, summed over that group, are the global batch's too: each
// rank's experts saw the tokens of its whole expert-parallel group.
// How many ranks share this rank's host and device (NOTE [Per-node shares] in dist/Launch.h): the engine
// sizes its automatic budgets from its share of the device's memory and of the host's memory and disk.
struct RankShares {
  int ranksOnHost = 1;
  int ranksOnDevice = 1;
};

class ZeroStepEngine final : public StepEngine {
 public:
  ZeroStepEngine(Objective& objective, const Config& config, Device device, DType compute,
                 dist::ProcessGroup* group = nullptr, dist::ProcessGroup* expertDataGroup = nullptr,
                 RankShares shares = {});
  StepOutcome step(const MicroBatchSource& next, int64_t microBatches, double lr) override;
  SaveTensors checkpointModel() const override;
  SaveTensors checkpointOptimizer() const override;
  void loadState(ChunkCheckpointReader& reader, bool optimizer) override;
  StepEngineState state() const override;
  void restore(const StepEngineState& state) override;
  const zero::ChunkManager& chunks() const override { return *chunks_; }
  const zero::ChunkLayout& checkpointLayout() const override { return checkpointLayout_; }
  size_t modelStateBytes() const override;
  // Where this rank's model state lives, bytes per tier (NOTE [Store placement] in zero/Store.h).
  const zero::StorePlacement& placement() const { return placement_; }
  // The optimizer over the chunks: AdamW or Adafactor (optimizer.type).
  const optim::ChunkOptimizer& optimizer() const { return *optimizer_; }
  // Stage 3: the most chunks gathered at once so far, and the arenas they are gathered into, one per slot
  // class (zero::planChunkArena; none below stage 3 or with store.arena off). NOTE [Chunk arena] in
  // zero/ChunkArena.h.
  size_t peakGatheredChunks() const { return peakGathered_; }
  std::vector<const zero::ChunkArena*> arenas() const {
    std::vector<const zero::ChunkArena*> out;
    for (const auto& a : arenas_) out.push_back(a.get());
    return out;
  }

 private:
  // One checkpoint piece of chunk c: its fp32 values (field Master), m or v over this rank's shard.
  SaveTensor savePiece(const char* kind, size_t c, int field) const;
  // One of chunk c's optimizer state fields (optim::ChunkStateField) as a checkpoint piece.
  SaveTensor saveField(const optim::ChunkStateField& field, size_t c) const;
  dist::Communicator& comm() const;
  // The group chunk c is sharded over (null: one rank), this rank's place in it, and its communicator.
  dist::ProcessGroup* groupOf(size_t c) const { return chunkGroups_[c]; }
  int rankIn(size_t c) const;
  // Whether chunk c's collectives communicate (several ranks, or one rank through NCCL), and the group's.
  bool communicates(size_t c) const;
  bool communicates() const;
  dist::Communicator& comm(size_t c) const;
  zero::ShardRange shard(size_t c) const { return chunks_->shard(c, rankIn(c)); }
  void gradientsComplete(size_t chunk);
  // Stages 1 and 2 on several ranks: every chunk gathered whole from the ranks' shards (a collective).
  void gatherShards();
  Tensor shardSquares(const std::vector<Tensor>& grads) const;
  // Stage 3 (NOTE [Parameter gathering] in StepEngine.cpp).
  void hookModules();
  void gather(size_t chunk);
  void startGather(size_t chunk);
  void release(size_t chunk);
  void releaseAll(bool prefetchedToo);

  // NOTE [Expert-parallel checkpoints]: the whole model's layout, and each chunk's index in it.
  void planCheckpointLayout(
      const std::vector<std::pair<std::string, std::function<std::string(int)>>>& rename, int expertRanks,
      int expertRank);
  zero::ChunkLayout checkpointLayout_;
  std::vector<int64_t> savedIndex_;

  Objective& objective_;
  nn::Module& model_;  // objective_.model()
  Device device_;
  DType compute_;
  double clipGrad_;
  int stage_ = 0;
  dist::ProcessGroup* group_ = nullptr;
  dist::ProcessGroup* expertDataGroup_ = nullptr;
  std::vector<dist::ProcessGroup*> chunkGroups_;  // by chunk: group_, or expertDataGroup_ for expert chunks
  int rank_ = 0;
  std::unique_ptr<zero::ChunkManager> chunks_;
  // The SSD tier, when the placement uses it. Declared before the optimizer so that it is destroyed after
  // it: a delayed SSD update may still be using the tier when the engine goes (the optimizer waits for it).
  std::unique_ptr<zero::NvmeTier> nvme_;
  std::unique_ptr<optim::ChunkOptimizer> optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::vector<Tensor> shardGrads_;   // stages 2, 3: this rank's reduced fp32 shard of each chunk's gradients
  std::vector<Tensor> paramShards_;  // stage 3: this rank's shard of each chunk's parameters
  zero::StorePlacement placement_;
  // NOTE [Memory tracer]: the first step is traced, then optimizer state moves onto the device.
  bool trace_ = false;
  bool delayedUpdate_ = false;  // store.delayed_update (NOTE [Delayed SSD update] in optim/AdamW.h)
  uint64_t deviceMemory_ = 0;
  void promoteTracedState();
  std::vector<Tensor> slots_;  // stage 3: each chunk's gathered parameters while it is resident
  std::map<nn::Module*, std::vector<size_t>>
      moduleChunks_;                              // stage 3: the chunks of each module's own parameters
  std::vector<nn::Module*> active_;               // stage 3: modules whose forward is running
  std::vector<std::unique_ptr<Event>> gathered_;  // stage 3: each chunk's last gather, on the comm stream
  std::vector<bool> prefetched_;                  // stage 3: gathered ahead and not used yet
  std::vector<size_t> order_;  // stage 3: the chunks in the order the first micro-batch gathered them
  size_t cursor_ = 0;          // stage 3: how far this pass has come in order_
  bool recording_ = true;
  int64_t prefetchDepth_ = 2;
  std::vector<int64_t> chunkNotices_;
  int64_t steps_ = 0;

  // Stage 3 with store.arena: where slots_ live, and each gathered chunk's slot (-1: none).
  std::vector<std::unique_ptr<zero::ChunkArena>> arenas_;
  std::vector<int> arenaClass_;  // per chunk: its arena
  std::vector<int> arenaSlot_;
  size_t gatheredNow_ = 0, peakGathered_ = 0;  // stage 3: chunks gathered now, and the most at once
};

}  // namespace strata::train
