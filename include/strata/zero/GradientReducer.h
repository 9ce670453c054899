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
//
// NOTE [Gradient homes]
// A chunk whose optimizer state is off the device (host memory or the SSD) is updated on the CPU from its
// gradients in host memory; a chunk whose gradients have a home in host memory (store.gradient_home: host,
// every chunk whose state is off the device; auto, those whose parameters are homed off it too) sends them
// there as soon as they are reduced, instead of at the update. In the step's last backward, once the
// chunk's gradients are complete and reduced (at stage 3 this rank's shard, after the reduce-scatter), the
// comm stream, after the reduction, runs the step end's own work on them while they are still on the
// device (the engine's callback: the chunk's partial sums of the squared norm, ops::sumOfSquaresParts,
// which the step end adds with the other chunks' in one ops::sumParts, so the step-end decision reads the
// bits it would have read had they stayed: NOTE [Step-end decision] in train/StepEngine.h), copies them
// into the chunk's page-locked host buffer, and the device buffer goes back to the allocator at once (a
// fence on the comm stream keeps it from reuse until the copy is done). The update then reads the host
// buffer: AdamW's CPU lane of the pipelined update without a copy of its own (NOTE [Pipelined update] in
// optim/AdamW.h); Adafactor, which updates host chunks on the GPU, copies it back in with the chunk's state
// (NOTE [Adafactor host chunks] in optim/Adafactor.h). So the device never holds every gradient buffer at the
// end of backward. Earlier micro-batches of the step accumulate in the device buffers as before: with
// gradient accumulation every buffer is on the device through the last micro-batch's forward, and the buffers
// leave during its backward. The host buffers are made on first use and kept (4 bytes per element of the
// chunk's gradients, 2 for 16-bit buffers); where they cannot be page-locked (zero_optimization.pin_memory:
// false, or the driver's limit) the chunk's gradients stay on the device. ZeRO stages 0 and 3 only, the
// stages parameter homes run at (NOTE [Parameter homes] in zero/ParameterGatherer.h), without pipelines
// (their chunks complete after the schedule, outside backward) or PowerSGD (its factors are summed in the
// gradients' place): the engine refuses store.gradient_home: host there, and auto keeps them on the device.
#pragma once

#include <cstdint>
#include <functional>
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
  // After the update: every gradient buffer and shard goes back to the allocator (the host homes stay).
  void release();

  // NOTE [Gradient homes]: `homed(c)` says whether chunk c's reduced gradients leave the device in this
  // step; `beforeLeaving(c, grads)` runs first on the comm stream, with the gradients finish() would have
  // given on the device. The host buffers are page-locked where `pinned` (a GPU copies into them); a chunk
  // whose buffer could not be page-locked keeps its gradients on the device.
  void setGradientHomes(std::function<bool(size_t)> homed,
                        std::function<void(size_t, const Tensor&)> beforeLeaving, bool pinned);
  // Whether chunk c's gradients of the step in progress are in host memory (from its reduction to
  // release()), and the bytes of the host buffers made so far.
  bool onHost(size_t c) const { return onHost_[c]; }
  uint64_t hostGradientBytes() const;

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
  // NOTE [Gradient homes]: chunk c's reduced gradients `grads` to its host buffer, the device's released.
  void sendHome(size_t chunk, const Tensor& grads);

  ChunkManager& chunks_;
  const ChunkGroups& groups_;
  int stage_;
  Device device_;
  std::vector<Tensor> shardGrads_;  // stages 2, 3: this rank's reduced fp32 shard of each chunk's gradients
  std::vector<int64_t> notices_;    // by chunk: gradient-complete notices in this step
  PowerSgdOptions powerSgdOptions_;
  std::unique_ptr<PowerSgd> powerSgd_;  // null: off
  std::function<bool(size_t)> homed_;   // NOTE [Gradient homes]; null: every chunk's stay
  std::function<void(size_t, const Tensor&)> beforeLeaving_;
  bool pinHomes_ = false;
  std::vector<Tensor> hostGrads_;  // by chunk: its host buffer, once made
  std::vector<bool> onHost_;       // by chunk: this step's gradients are in hostGrads_
  int64_t steps_ = 0;
};

}  // namespace strata::zero
