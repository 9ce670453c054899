// What the step engine (train/StepEngine.h) asks of an optimizer over chunks (zero/ChunkManager.h): AdamW
// (optim/AdamW.h) and Adafactor (optim/Adafactor.h) both implement it, so the engine, its checkpoints, the
// store's placement and the memory tracer do not depend on which one runs.
//
// Every chunk c has a range of elements whose optimizer state this rank keeps (ranges(); the whole padded
// chunk, or this rank's ZeRO shard), and a home tier for that state (home(c); zero/Store.h). The state of a
// chunk is its fp32 master (when separate from the parameters) and the optimizer's own fields, which
// chunkState lists for checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/zero/ChunkManager.h"
#include "strata/zero/NvmeTier.h"
#include "strata/zero/Store.h"

namespace strata::optim {

// The last update's off-device seconds by phase (NOTE [Pipelined update] in optim/AdamW.h): gradients to
// the host, the CPU kernel, parameters back to the device, waiting for the SSD, and waiting for the GPU
// lane; the share of the off-device elements the GPU updated.
struct OffloadPhases {
  double gradientsOut = 0, cpuUpdate = 0, parametersIn = 0, ssdWait = 0, gpuLaneWait = 0;
  double gpuLaneShare = 0;
};

// One field of a chunk's optimizer state, as a checkpoint saves it.
struct ChunkStateField {
  std::string kind;  // the checkpoint's piece kind: "exp_avg", "exp_avg_sq", "adafactor_v"
  Tensor values;     // flat; on the device or the host; undefined where the chunk's state is on the SSD
  // True: one value per element of the chunk's range (a checkpoint reshards it by parameter, at any world
  // size and chunk size). False: a layout of the optimizer's own (Adafactor's factored statistics), which
  // reloads only into the same chunk layout and shard.
  bool elementwise = true;
  // The SSD tier's field that holds it, where the chunk's state is on the SSD (zero/NvmeTier.h).
  zero::NvmeTier::Field ssdField = zero::NvmeTier::FirstMoment;
};

// A flat tensor of `numel` elements of host-resident optimizer state, from the host state allocator
// (NOTE [Host state memory] in core/Allocator.h), page-locked when `pinned`; uninitialised.
Tensor hostStateTensor(int64_t numel, DType dtype, bool pinned);
// The bytes of a chunk's master, first and second moment, each counted when defined.
uint64_t chunkStateBytes(const Tensor& master, const Tensor& m, const Tensor& v);

class ChunkOptimizer {
 public:
  virtual ~ChunkOptimizer() = default;
  // One update at learning rate `lr` from flat gradients, one per chunk: either the chunk's whole (padded)
  // gradient buffer or just its range (fp32, or for optimizers that say so the compute dtype), times
  // `gradScale` (a device fp32 scalar: unscaling and clipping; undefined for 1).
  virtual void stepChunks(double lr, const std::vector<Tensor>& gradients, const Tensor& gradScale) = 0;
  virtual int64_t stepCount() const = 0;
  virtual void setStepCount(int64_t step) = 0;
  // NOTE [Delayed SSD update] in optim/AdamW.h: an update that runs in the background and leaves chunks'
  // parameters one update behind their state until the next update writes them.
  // Waits for such an update: its state is then final (what a checkpoint reads), its parameters pending.
  virtual void waitDelayed() {}
  // Waits for it and writes every pending parameter into the chunks.
  virtual void finishDelayed() {}
  // The values (over ranges()[c], in the parameters' dtype, on the host) that the next update writes into
  // chunk c's parameters before it runs, where they lag the chunk's state; undefined where they do not.
  // Waits for a running update.
  virtual Tensor pendingParameters(size_t /*c*/) { return Tensor(); }
  // Makes `values` (as pendingParameters gives them) chunk c's pending parameters, for a checkpoint saved
  // with them pending. False where the optimizer keeps none (nothing is done).
  virtual bool deferParameters(size_t /*c*/, const Tensor& /*values*/) { return false; }
  virtual const std::vector<zero::ShardRange>& ranges() const = 0;
  virtual zero::Tier home(size_t c) const = 0;
  // Whether chunk c's fp32 values are separate from its parameters, and those masters per chunk (undefined
  // where the parameters are their own masters, or where the state lives on the SSD).
  virtual bool hasMaster(size_t c) const = 0;
  virtual const std::vector<Tensor>& masterFlats() const = 0;
  // Chunk c's state beside the master, for checkpoints; where it lives on the SSD, the fields without
  // values (the engine reads and writes the SSD tier's fields itself).
  virtual std::vector<ChunkStateField> chunkState(size_t c) const = 0;
  // Bytes chunk c's state (master and fields) takes in memory, on the device or the host.
  virtual uint64_t stateBytes(size_t c) const = 0;
  // The same if chunk c's state were on the device (the memory tracer's promotion).
  virtual uint64_t deviceStateBytes(size_t c) const = 0;
  // Moves chunk c's state from the host (or the SSD) to `device`.
  virtual void moveToDevice(size_t c, Device device) = 0;
  // Rounds every master into its 16-bit parameters (after the masters were loaded).
  virtual void writeParameters() = 0;
  // Wall seconds the last update spent on state off the device, and by phase.
  virtual double offDeviceSeconds() const { return 0; }
  virtual OffloadPhases offloadPhases() const { return {}; }
  // Whether stepChunks reads gradients in `dtype` (fp32 always; AdamW and Adafactor 16-bit ones too).
  virtual bool acceptsGradients(DType dtype) const { return dtype == DType::F32; }
};

}  // namespace strata::optim
