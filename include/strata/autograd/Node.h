// The autograd graph.
//
// Each differentiable op records a Node whose backward sits next to the op's forward (recordFunction with a
// closure). A node's next edges point at the nodes that produced its inputs; leaves that require grad end in
// an AccumulateGrad node, which adds the finished gradient into tensor.grad() and then fires the tensor's
// gradient-complete hooks (ZeRO reduce-scatters from there; see NOTE [Backward passes] in Engine.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::autograd {

class Node;
using Grads = std::vector<Tensor>;

struct Edge {
  std::shared_ptr<Node> node;
  int inputNr = 0;
  bool valid() const { return node != nullptr; }
};

struct OutputMeta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;

  // Gradients of this node's outputs in, gradients of its inputs (one per next edge) out.
  virtual Grads apply(Grads&& gradOutputs) = 0;
  // Drops saved tensors after a backward pass that did not ask to retain the graph.
  virtual void releaseSaved() {}

  const std::string& name() const { return name_; }
  // Creation order; the engine runs later nodes first.
  uint64_t sequenceNr() const { return sequenceNr_; }
  // The sequence number the next node created will get: places an event (a hook firing) among the nodes of
  // the forward, for tracers and tests.
  static uint64_t peekNextSequenceNr();
  std::vector<Edge>& nextEdges() { return nextEdges_; }
  const std::vector<Edge>& nextEdges() const { return nextEdges_; }
  std::vector<OutputMeta>& outputs() { return outputs_; }
  size_t numOutputs() const { return outputs_.empty() ? 1 : outputs_.size(); }

  // Hooks that run before apply(), once the gradients of all outputs have arrived.
  void addPreHook(std::function<void()> hook) { preHooks_.push_back(std::move(hook)); }
  void runPreHooks() {
    for (auto& h : preHooks_) h();
  }

 private:
  std::string name_;
  uint64_t sequenceNr_;
  std::vector<Edge> nextEdges_;
  std::vector<OutputMeta> outputs_;
  std::vector<std::function<void()>> preHooks_;
};

using BackwardFn = std::function<Grads(const Grads& gradOutputs)>;

// A node whose backward is a closure over the tensors it saved.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, BackwardFn fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  Grads apply(Grads&& gradOutputs) override;
  void releaseSaved() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
};

// The sink of a leaf tensor's gradient: adds it into leaf.grad(), then declares the gradient complete
// (completeGradient in Engine.h fires the gradient-complete hooks).
//
// NOTE [Gradient accumulation in place]
// The first gradient of a leaf becomes its .grad (the incoming buffer itself when nothing else holds it,
// else a copy). Later gradients (the next micro-batches) are added into that .grad in place, element by
// element as add(grad, g) would, so accumulation allocates nothing and a .grad that is a view into a flat
// buffer (a chunk's fp32 gradients) keeps receiving them. As in PyTorch, a handle taken from grad() sees
// later accumulation: clone it to keep a snapshot. The add is out of place, giving a new .grad, when .grad
// cannot take it: another dtype or device than the gradient (after its cast to the leaf's), not
// contiguous, or overlapping the incoming gradient other than element for element.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  Grads apply(Grads&& gradOutputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// NOTE [Gradient buffers]
// A leaf may have a gradient home (setGradHome): a gradient dtype and a function that makes the tensor its
// gradient goes into, called by the first gradient of a step. The chunk manager gives each 16-bit parameter
// a view into its chunk's flat fp32 gradient buffer, allocated when the chunk's first gradient arrives in
// backward and released after the optimizer step, so gradients take memory only from backward to update (as
// per-tensor gradients did) while being one flat buffer per chunk. The first write of a step stores, the
// next ones add in place, in the home's dtype (gradDType); grad() is the view once written, and
// Tensor::setGrad(undefined) lets go of it, so zeroing gradients costs no pass.
// A node may write a leaf's gradient straight into its home from its backward (a weight-gradient GEMM with
// beta = 0 or 1, Megatron's gradient-accumulation fusion): claimGradBuffer() hands it the buffer and
// whether to add, and the node returns no gradient for that input. The engine still counts the edge, so
// the leaf's gradient-complete hooks fire once all its edges are in (NOTE [Backward passes] in Engine.h).
// A leaf with gradient hooks (Tensor::registerGradHook) is never claimed: its hooks must see the gradient.

// Gives `leaf` a gradient home: `make` returns a tensor of the leaf's shape in `dtype` (floating,
// contiguous, on the leaf's device). Drops the current gradient. An undefined `make` removes the home.
void setGradHome(const Tensor& leaf, DType dtype, std::function<Tensor()> make);
// A home that is always `buffer`.
void setGradBuffer(const Tensor& leaf, const Tensor& buffer);
// The dtype `t`'s gradient accumulates in: its gradient home's, else its own.
DType gradDType(const Tensor& t);
// A claimed gradient buffer: write into `buffer`, storing when !accumulate and adding when accumulate.
struct GradSink {
  Tensor buffer;
  bool accumulate = false;
  explicit operator bool() const { return buffer.defined(); }
};
// For a leaf with a gradient home and no gradient hooks, called from a backward: the buffer (made when this
// is the step's first gradient), which becomes the leaf's grad(); the caller must write it. Empty otherwise
// (return the gradient as usual). evenWithHooks: AccumulateGrad, after running the hooks.
GradSink claimGradBuffer(const Tensor& t, bool evenWithHooks = false);

// True when t takes part in the graph: a leaf that requires grad, or the output of a recorded op.
inline bool participates(const Tensor& t) {
  return t.defined() && (t.requiresGrad() || t.gradFn() != nullptr);
}
// True when grad mode is on and any input participates.
bool needsGrad(const std::vector<Tensor>& inputs);
// Where the gradient of t goes: its producing node, or its leaf accumulator. Invalid when t does not
// participate.
Edge gradientEdge(const Tensor& t);

// Records `fn` as the backward of `outputs` with respect to `inputs`, when needsGrad(inputs). fn receives one
// gradient per output and returns one per input (undefined for inputs that need none). Returns the node, or
// null when nothing was recorded.
std::shared_ptr<Node> recordFunction(const char* name, const std::vector<Tensor>& inputs,
                                     const std::vector<Tensor>& outputs, BackwardFn fn);

// Identity on `tensors` whose backward calls `hook` once the gradients of all of them have arrived (before
// they flow on). Tensors that do not participate pass through untouched. Module backward hooks are built on
// this.
std::vector<Tensor> withBackwardHook(const std::vector<Tensor>& tensors, std::function<void()> hook);

}  // namespace strata::autograd
