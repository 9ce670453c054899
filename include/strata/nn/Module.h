// Module: a named tree of parameters and submodules with train/eval mode and hooks.
//
// Hooks (ZeRO hangs gather and release on these):
// - forward pre-hook: before the module computes, with the inputs;
// - forward hook: after it computes, with inputs and outputs;
// - backward pre-hook: in backward, once the gradients of all the module's outputs have arrived, before any
//   of its own backward runs (the outputs pass through an identity node that fires it);
// - backward hook: in backward, once the gradients of the module's inputs are computed, i.e. its backward
//   is done. It fires only when some input takes part in the graph; parameter gradient-complete hooks cover
//   the rest.
//
// NOTE [Module calls]
// Every way into a module is a *call*, and every call runs the hooks: forward(), operator(), the layers'
// typed entry points (Linear::apply, LayerNorm::applyResidual, Embedding::unembed, CausalLM::loss, ...)
// all go through call(). They are non-virtual; a module's computation is the protected virtual
// forwardImpl() (and logitsImpl()/lossImpl() for a CausalLM), which only call() runs. Inside an
// implementation, submodules are used through their entry points, never by reading their parameters:
// where a fused kernel needs a child's parameters (Mlp's geluMlp reads fc's and proj's, GPT's tied head
// reads wte's table), the kernel runs inside the child's call (child.call(inputs, body), or fusedCall() for
// several children), so the child's hooks fire around that use in forward and, through the identity node
// on the outputs, before its backward. A module used twice (a tied embedding) is called twice: its hooks
// fire around each use. A call nested in a call of the same module (an implementation that calls its own
// entry point) runs no hooks of its own.
// With no hook registered a call adds nothing to the graph and costs tens of nanoseconds (its input and
// output vectors).
// The outermost call (no module call around it on this thread) also sees to the parameters' gradient
// notices: when some parameter of its tree has gradient-complete hooks, its backward queues an
// end-of-backward callback that calls autograd::completeGradient on every parameter of the tree, so each of
// them, used or not, is notified exactly once per backward pass (NOTE [Backward passes] in
// strata/autograd/Engine.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::nn {

// What a module call runs: a callable taking the call's inputs and returning its outputs.
template <class F>
concept CallBodyFn = (std::is_invocable_r_v<std::vector<Tensor>, const F&, const std::vector<Tensor>&>);

// The body of a module call: a non-owning reference to a CallBodyFn, made from a lambda at the call site and
// valid for that full expression (no allocation, unlike std::function).
class CallBody {
 public:
  template <CallBodyFn F>
  CallBody(const F& body)  // NOLINT(google-explicit-constructor): made from lambdas at call sites
      : body_(&body), invoke_(&invoke<F>) {}
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) const { return invoke_(body_, inputs); }

 private:
  template <class F>
  static std::vector<Tensor> invoke(const void* body, const std::vector<Tensor>& inputs) {
    return (*static_cast<const F*>(body))(inputs);
  }

  const void* body_;
  std::vector<Tensor> (*invoke_)(const void*, const std::vector<Tensor>&);
};

class Module {
 public:
  using ForwardPreHook = std::function<void(Module&, const std::vector<Tensor>& inputs)>;
  using ForwardHook =
      std::function<void(Module&, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs)>;
  using BackwardHook = std::function<void(Module&)>;

  virtual ~Module() = default;

  // The computation (forwardImpl) as a call: hooks run around it (NOTE [Module calls]).
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs);
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs) { return forward(inputs); }
  Tensor operator()(const Tensor& input);

  // Runs `body` on `inputs` as one call of this module: forward pre-hooks, then body (on the inputs, passed
  // through the backward hook's identity node when there is one: body must read the vector it is given),
  // then forward hooks, then the backward pre-hook's identity node on the outputs. Entry points are written
  // with it, and so is a parent's fused use of this module's parameters.
  std::vector<Tensor> call(const std::vector<Tensor>& inputs, CallBody body);

  // Parameters are leaves that require grad (unless told otherwise); buffers are state without gradients.
  Tensor& registerParameter(const std::string& name, Tensor tensor, bool requiresGrad = true);
  Tensor& registerBuffer(const std::string& name, Tensor tensor);
  template <class M>
  std::shared_ptr<M> registerModule(const std::string& name, std::shared_ptr<M> module) {
    addChild(name, module);
    return module;
  }

  // Dotted names ("h.3.attn.qkv.weight"), in registration order, depth first.
  std::vector<std::pair<std::string, Tensor>> namedParameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> namedBuffers(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Module*>> namedModules();
  std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() { return children_; }
  int64_t numParameters() const;
  // Converts every parameter to `dtype` in place (each tensor keeps its identity; a tied one is converted
  // once) and drops their gradients. Layers compute in their parameters' dtype, so this is how a model runs
  // in bf16 outside training (training lays the parameters out in chunks of the compute dtype itself).
  void castParameters(DType dtype);

  // Activation recomputation (train.recompute full; nn::applyRecompute in nn/TransformerBlock.h): while
  // gradients are recorded, forward() runs forwardImpl inside checkpoint() (autograd/Checkpoint.h), so the
  // call keeps only its inputs and runs again in backward, its child calls and their hooks included (ZeRO-3
  // gathers a recomputed block's chunks again). Entry points that run their own body through call() are
  // not recomputed.
  void setRecompute(bool on) { recompute_ = on; }
  bool recomputes() const { return recompute_; }

  void train(bool on = true);
  void eval() { train(false); }
  bool isTraining() const { return training_; }
  void zeroGrad();

  void addForwardPreHook(ForwardPreHook hook) { forwardPreHooks_.push_back(std::move(hook)); }
  // Removes the forward pre-hook added last: for a temporary hook added and removed around one pass.
  void popForwardPreHook() {
    STRATA_CHECK(!forwardPreHooks_.empty(), "popForwardPreHook: the module has no forward pre-hook");
    forwardPreHooks_.pop_back();
  }
  void addForwardHook(ForwardHook hook) { forwardHooks_.push_back(std::move(hook)); }
  void addBackwardPreHook(BackwardHook hook) { backwardPreHooks_.push_back(std::move(hook)); }
  void addBackwardHook(BackwardHook hook) { backwardHooks_.push_back(std::move(hook)); }

 protected:
  // The module's computation. Runs only inside a call (forward() and the entry points see to that).
  virtual std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) = 0;

 private:
  class ActiveCall;
  bool recompute_ = false;

  void addChild(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool recurse, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  bool hasHooks() const;
  bool treeHasGradCompleteHooks() const;
  void completeTreeGradients() const;
  std::vector<Tensor> hookedCall(const std::vector<Tensor>& inputs, CallBody body, bool completeTree);

  bool training_ = true;
  int activeCalls_ = 0;  // calls of this module running on the stack
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> forwardPreHooks_;
  std::vector<ForwardHook> forwardHooks_;
  std::vector<BackwardHook> backwardPreHooks_;
  std::vector<BackwardHook> backwardHooks_;
};

// Runs `body` as one call of each of `modules`, nested in the order given (the first outermost): for a
// fused kernel that reads the parameters of several modules at once (Mlp's geluMlp reads fc's and proj's).
// Each module's hooks see `inputs` and the body's outputs.
std::vector<Tensor> fusedCall(const std::vector<Module*>& modules, const std::vector<Tensor>& inputs,
                              CallBody body);

}  // namespace strata::nn
