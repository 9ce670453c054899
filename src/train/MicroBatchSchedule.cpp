#include "strata/train/MicroBatchSchedule.h"

namespace strata::train {

void SequentialSchedule::run(int64_t microBatches, const MicroBatchWork& work) const {
  for (int64_t micro = 0; micro < microBatches; ++micro) work.backward(micro, work.forward(micro));
}

}  // namespace strata::train
