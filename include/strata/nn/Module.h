// Module: a named tree of parameters and submodules with train/eval mode and hooks.
//
// Hooks (ZeRO hangs gather and release on these):
// - forward pre-hook: before forward(), with the inputs;
// - forward hook: after forward(), with inputs and outputs;
// - backward pre-hook: in backward, once the gradients of all the module's outputs have arrived, before the
// module's
//   own backward runs (the outputs pass through an identity node that fires it);
// - backward hook: in backward, once the gradients of the module's inputs are computed, i.e. its backward is
// done.
//   It fires only when some input takes part in the graph; parameter gradient-complete hooks cover the rest.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/Tensor.h"

namespace strata::nn {

class Module {
 public:
  using ForwardPreHook = std::function<void(Module&, const std::vector<Tensor>& inputs)>;
  using ForwardHook =
      std::function<void(Module&, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs)>;
  using BackwardHook = std::function<void(Module&)>;

  virtual ~Module() = default;

  // The computation. Call the module through operator() so that hooks run.
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs) = 0;
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs);
  Tensor operator()(const Tensor& input);

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

  void train(bool on = true);
  void eval() { train(false); }
  bool isTraining() const { return training_; }
  void zeroGrad();

  void addForwardPreHook(ForwardPreHook hook) { forwardPreHooks_.push_back(std::move(hook)); }
  void addForwardHook(ForwardHook hook) { forwardHooks_.push_back(std::move(hook)); }
  void addBackwardPreHook(BackwardHook hook) { backwardPreHooks_.push_back(std::move(hook)); }
  void addBackwardHook(BackwardHook hook) { backwardHooks_.push_back(std::move(hook)); }

 private:
  void addChild(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool recurse, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out) const;

  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<ForwardPreHook> forwardPreHooks_;
  std::vector<ForwardHook> forwardHooks_;
  std::vector<BackwardHook> backwardPreHooks_;
  std::vector<BackwardHook> backwardHooks_;
};

}  // namespace strata::nn
