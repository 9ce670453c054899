// Activation checkpointing: run `fn` without recording its graph, keep only its inputs, and recompute it
// during backward. The default generator's state is replayed, so dropout masks come out the same the second
// time.
#pragma once

#include <functional>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

}  // namespace strata
