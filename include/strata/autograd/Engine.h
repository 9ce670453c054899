// The backward engine: walks the graph from the roots in reverse creation order, summing gradients that meet.
#pragma once

#include <vector>

#include "strata/core/Tensor.h"

namespace strata {

// Computes gradients of `roots` with respect to every leaf that requires grad, accumulating into leaf.grad().
// `grads` gives the gradient of each root; it may be empty when each root has one element (gradient 1).
// Unless `retainGraph`, saved tensors are freed and a second backward through the same graph throws.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads = {},
              bool retainGraph = false);
inline void backward(const Tensor& root, bool retainGraph = false) {
  backward(std::vector<Tensor>{root}, {}, retainGraph);
}

}  // namespace strata
