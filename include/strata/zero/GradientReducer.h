// ZeRO's gradient reduction: each chunk's gradients summed over the ranks that shard it, as soon as they are
// final in the step's last backward (NOTE [Chunk gradients complete] in zero/ChunkManager.h), overlapping
// the rest of that backward.
// - Stages 0 and 1: the chunk's gradient buffer is all-reduced in place; every rank then holds the sum.
// - Stages 2 and 3: it is reduce-scattered into this rank's fp32 shard, and the chunk's full buffer goes
//   back to the allocator at once, for the next chunk's gradients.
// - With PowerSGD (stages 0 and 1, from its start step on): the chunk's gradients are summed as rank-r
//   factors where that sends fewer bytes, the rest exactly (NOTE [PowerSGD] in zero/PowerSgd.h).
// The collectives run on the comm stream (NOTE [Collective lanes] in distributed/Communicator.h), each after
// the backward that wrote its gradients; finish() makes the compute stream wait for them. 16-bit gradient
// buffers (precision.grad_accum_dtype) are summed in fp32: a 16-bit reduction would round at every hop of
// NCCL's ring.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/zero/ChunkGroups.h"
#include "strata/zero/ChunkManager.h"

namespace strata::zero {

class PowerSgd;

// PowerSGD's settings (NOTE [PowerSGD] in zero/PowerSgd.h): rank 0 is off; the first `startStep` steps are
// reduced exactly; `seed` draws the first Q matrices.
struct PowerSgdOptions {
  int64_t rank = 0;
  int64_t startStep = 0;
  uint64_t seed = 0;
};

class GradientReducer {
 public:
  // Listens to `chunks`' gradient-complete notices (a manager has one listener: the last one set), at ZeRO
  // stage `stage`. PowerSGD (powerSgd.rank > 0) needs stage 0 or 1.
  GradientReducer(ChunkManager& chunks, const ChunkGroups& groups, int stage, Device device,
                  PowerSgdOptions powerSgd = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // After the step's last backward: checks that every chunk completed exactly once, and returns per chunk
  // the gradients this rank updates from (the reduced chunk, or at stages 2 and 3 its reduced shard), with
  // the compute stream ordered after the reductions.
  std::vector<Tensor> finish();
  // After the update: every gradient buffer and shard goes back to the allocator.
  void release();

  // Steps reduced so far (finish() counts them); a resume sets it, PowerSGD starts at powerSgd.startStep.
  int64_t steps() const { return steps_; }
  void setSteps(int64_t steps) { steps_ = steps; }
  // After a step whose gradients were not finite (a skipped update): PowerSGD's Q and error feedback, made
  // from them, are dropped; it starts afresh.
  void dropPowerSgdState();
  // Gradient elements one step sends over the data-parallel group: exactly, and with PowerSGD.
  int64_t plainElements() const;
  int64_t powerSgdElements() const;
  // Checkpoints: PowerSGD's state of chunk c (its Q matrices and this rank's error feedback) as one flat
  // fp32 tensor of powerSgdStateElements(c) elements (0: nothing to keep), whether it holds any yet, and
  // its load.
  int64_t powerSgdStateElements(size_t c) const;
  bool hasPowerSgdState(size_t c) const;
  Tensor savePowerSgdState(size_t c) const;
  void loadPowerSgdState(size_t c, const Tensor& flat);
  // Bytes of fp32 PowerSGD state (error feedback, Q) this rank keeps on the device: 0 when off.
  int64_t powerSgdStateBytes() const;

 private:
  // The shapes of the parameters of the chunks whose reductions communicate.
  std::vector<Shape> communicatedShapes() const;

  void reduce(size_t chunk);

  ChunkManager& chunks_;
  const ChunkGroups& groups_;
  int stage_;
  Device device_;
  std::vector<Tensor> shardGrads_;  // stages 2, 3: this rank's reduced fp32 shard of each chunk's gradients
  std::vector<int64_t> notices_;    // by chunk: gradient-complete notices in this step
  PowerSgdOptions powerSgdOptions_;
  std::unique_ptr<PowerSgd> powerSgd_;  // null: off
  int64_t steps_ = 0;
};

}  // namespace strata::zero
