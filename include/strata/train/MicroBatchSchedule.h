// Who runs which micro-batch when, inside one step. The step engine hands its schedule the work of a
// micro-batch, a forward that returns the micro-batch's loss and a backward from that loss; the schedule
// calls them, each micro-batch's forward before its backward, every micro-batch once. The engine keeps what
// a micro-batch's backward needs from its forward until that backward has run, so a schedule may hold
// several micro-batches between their forward and backward. The last backward a schedule runs completes the
// step's gradients (NOTE [Chunk gradients complete] in zero/ChunkManager.h); the step end follows.
//
// SequentialSchedule runs forward and backward of micro-batch 0, then of 1, and so on: gradient accumulation
// on one stage. A pipeline schedule (micro-batches across the stages of a pipeline-parallel model, as
// Megatron's 1F1B in core/pipeline_parallel/schedules.py) is another implementation of this interface.
#pragma once

#include <cstdint>
#include <functional>

#include "strata/core/Tensor.h"

namespace strata::train {

struct MicroBatchWork {
  std::function<Tensor(int64_t micro)> forward;                     // the micro-batch's loss
  std::function<void(int64_t micro, const Tensor& loss)> backward;  // from the loss its forward returned
};

class MicroBatchSchedule {
 public:
  virtual ~MicroBatchSchedule() = default;
  // Runs micro-batches 0 .. microBatches - 1 of one step.
  virtual void run(int64_t microBatches, const MicroBatchWork& work) const = 0;
};

class SequentialSchedule final : public MicroBatchSchedule {
 public:
  void run(int64_t microBatches, const MicroBatchWork& work) const override;
};

}  // namespace strata::train
