// The backward engine: walks the graph from the roots in reverse creation order, summing gradients that meet.
//
// NOTE [Backward passes]
// Each call of backward() is one backward pass. A pass has an id (currentBackwardPass(), increasing from 1)
// and runs in three phases:
// 1. every reachable node runs, latest created first, once all gradients of its outputs have arrived;
// 2. every leaf reachable from the roots whose gradient-complete hooks have not fired in this pass (it got no
//    gradient) has them fired now, by completeGradient();
// 3. the end-of-backward callbacks queued during the pass run, in the order queued (a callback may queue
//    more; they run too).
// If a node throws, the pass ends there: phases 2 and 3 do not run.
//
// Gradient-complete hooks (Tensor::registerGradCompleteHook) fire at most once per pass and leaf: from
// AccumulateGrad once the leaf's gradient is summed, or from completeGradient() for a leaf that got none
// (then grad() holds what earlier passes accumulated, or nothing). Leaves outside the graph (a parameter
// the forward never used) are not reachable from the roots: whoever knows them calls completeGradient()
// from an end-of-backward callback. nn::Module does this for the parameters of every outermost module call
// (see NOTE [Module calls] in strata/nn/Module.h), so each parameter of a model hears exactly once per
// backward pass, used or not.
//
// Micro-batches and chunks. Each micro-batch's backward is its own pass, so the notices come once per
// micro-batch. A chunk manager that needs "this chunk's gradients are final for the step" counts, per chunk,
// the notices of the current pass (resetting its counts when currentBackwardPass() changes), and is told by
// the trainer which backward is the step's last micro-batch. In that pass a chunk whose count reaches its
// parameter count is final: it may reduce-scatter from inside the hook while backward goes on. An
// end-of-backward callback it queues from any hook of the pass is where it flushes the rest.
//
// Nested passes. A backward() started while another runs on the same thread (checkpoint() recomputes inside
// its node's backward) is a pass of its own: callbacks queued while it runs belong to it, and its leaves
// count as completed in the enclosing passes too, so an enclosing pass's phase 2 and completeGradient() do
// not notify them again. A leaf that takes part in both (used inside and outside a checkpointed region) is
// not served well: notified once, by the inner pass, when that completes it first (the outer pass still
// adds to its gradient afterwards), and twice when the outer pass completes it first. checkpoint() has to
// recompute inside the outer pass (non-reentrant) before ZeRO relies on notices across it.
#pragma once

#include <cstdint>
#include <functional>
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

namespace autograd {

// Whether a backward pass is running on this thread.
bool inBackwardPass();
// The id of the innermost backward pass running on this thread; 0 when none runs. Ids increase from 1 and
// are never reused in a process.
uint64_t currentBackwardPass();
// The id of the outermost backward pass running on this thread (the backward() the user called, around any
// nested recomputation passes); 0 when none runs.
uint64_t outermostBackwardPass();
// Runs `callback` at the end of the current (innermost) backward pass, after every node has run and every
// reachable leaf has been notified (NOTE [Backward passes]). Only valid while a pass runs, i.e. from a hook
// or a node's backward; throws otherwise.
// With `outermost`, at the end of the outermost pass instead.
void queueEndOfBackwardCallback(std::function<void()> callback, bool outermost = false);
// Declares `leaf`'s gradient complete for the current pass: fires its gradient-complete hooks unless they
// already fired in this pass (or in a pass nested in it). Outside a backward pass it fires them.
// AccumulateGrad calls this after adding a gradient; end-of-backward callbacks call it for leaves that got
// none.
void completeGradient(const Tensor& leaf);
// Whether `leaf`'s gradient-complete hooks fired in the current pass (or a pass nested in it).
bool gradientCompleted(const Tensor& leaf);

}  // namespace autograd
}  // namespace strata
