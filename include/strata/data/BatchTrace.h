// One forward and backward of a training objective on a micro-batch, with everything another implementation
// of the same model needs to repeat it and compare (tools/hf_parity_zoo.py against HF transformers):
// the inputs the objective fed the model (Objective::modelInputs), its logits (Objective::logits), the loss
// (Objective::loss, the path training takes) and every parameter's gradient of that loss, under the names of
// an HF layout (models/HfLayout.h). Nothing here knows the architecture.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "models/HfLayout.h"
#include "strata/data/Objective.h"

namespace strata::data {

struct BatchTrace {
  std::vector<std::pair<std::string, Tensor>> inputs;     // Objective::modelInputs
  std::vector<std::pair<std::string, Tensor>> outputs;    // Objective::logits (fp32)
  Tensor loss;                                            // fp32 scalar
  std::vector<std::pair<std::string, Tensor>> gradients;  // "grad.<HF name>", fp32, in layout order

  // Everything as one list of named tensors (inputs, outputs, "loss", gradients) for a safetensors file.
  std::vector<std::pair<std::string, Tensor>> all() const;
};

// The model's parameters must not hold gradients yet (they are left holding this batch's). `compute` is the
// dtype the model computes in (fp32 for a parity check).
BatchTrace traceBatch(Objective& objective, const TokenBatch& batch, DType compute,
                      const models::HfLayout& layout);

}  // namespace strata::data
