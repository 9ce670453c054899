// The step engine: one optimizer step of a model, from micro-batches to updated weights.
//
// The training loop (Trainer) owns data, the schedule, logging, evaluation and checkpoints; a StepEngine owns
// everything inside a step: forward and backward per micro-batch, the global gradient norm, the decision that
// the step may be applied (finite loss and norm; fp16's loss scale), the update with its clipping
// coefficient, and zeroing the gradients. LocalStepEngine is the single-rank step with all state on the
// model's device; the ZeRO, store and pipelined-optimizer engines implement the same interface.
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
#include <memory>
#include <utility>

#include "strata/nn/CausalLM.h"
#include "strata/optim/AdamW.h"
#include "strata/optim/LossScaler.h"
#include "strata/train/Checkpoint.h"
#include "strata/train/Config.h"
#include "strata/zero/ChunkManager.h"

namespace strata::train {

// What one step did, read on the host.
struct StepOutcome {
  double loss = 0;       // mean loss over the micro-batches (NaN when not finite)
  double gradNorm = 0;   // global L2 norm of the unscaled gradients
  bool finite = true;    // loss and gradient norm were finite
  bool applied = false;  // the update ran (false: skipped, every state untouched)
  double lossScale = 1;  // fp16's loss scale after the step (1 otherwise)
};

// The engine's counters a checkpoint keeps, beside its tensors.
struct StepEngineState {
  int64_t optimizerSteps = 0;
  double lossScale = 0;  // 0: no loss scaler
  int64_t lossScaleGoodSteps = 0;
};

// Hands out the micro-batches of one step, (ids, targets) each, in order.
using MicroBatchSource = std::function<std::pair<Tensor, Tensor>()>;

class StepEngine {
 public:
  virtual ~StepEngine() = default;
  // One step at learning rate `lr` over `microBatches` micro-batches drawn from `next`.
  virtual StepOutcome step(const MicroBatchSource& next, int64_t microBatches, double lr) = 0;
  // The model's fp32 weights by parameter name (the optimizer's masters; the parameters when fp32): what a
  // checkpoint saves as the model, and where a checkpoint loads it; call mastersLoaded() after a load.
  virtual NamedTensors modelState() const = 0;
  virtual void mastersLoaded() = 0;
  // The optimizer's tensors by name (checkpoints).
  virtual NamedTensors optimizerState() const = 0;
  virtual StepEngineState state() const = 0;
  virtual void restore(const StepEngineState& state) = 0;
};

// The single-rank step, all state on the model's device: AdamW, clipping from optimizer.clip_grad, and for
// fp16 dynamic loss scaling from the precision section. The constructor records the parameters' first-use
// order with one forward of one sequence (in eval mode, the RNG untouched) and moves them into chunks of
// zero_optimization.chunk_size_mb in the compute dtype (zero/ChunkManager.h), with fp32 gradient buffers
// and, for 16-bit compute, fp32 masters held by AdamW per chunk; numbers do not depend on the layout. The
// model passed in holds fp32 parameters; afterwards it holds compute-dtype views into the chunks.
class LocalStepEngine final : public StepEngine {
 public:
  LocalStepEngine(nn::CausalLM& model, const Config& config, Device device, DType compute);
  StepOutcome step(const MicroBatchSource& next, int64_t microBatches, double lr) override;
  NamedTensors modelState() const override { return optimizer_->namedMasters(); }
  void mastersLoaded() override;
  NamedTensors optimizerState() const override { return optimizer_->namedState(); }
  StepEngineState state() const override;
  void restore(const StepEngineState& state) override;
  const zero::ChunkManager& chunks() const { return *chunks_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }

 private:
  void layOutChunks(int64_t chunkBytes);

  nn::CausalLM& model_;
  Device device_;
  DType compute_;
  double clipGrad_;
  std::unique_ptr<zero::ChunkManager> chunks_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::vector<int64_t> chunkNotices_;
  int64_t steps_ = 0;
};

}  // namespace strata::train
