#include "strata/nn/Module.h"

#include <set>

#include "strata/autograd/Checkpoint.h"
#include "strata/autograd/Engine.h"
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/nn/DeferredInit.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

namespace {
// Module calls running on this thread (any module): zero outside every call.
thread_local int tCallDepth = 0;
}  // namespace

// Counts a call for its lifetime, however it ends.
class Module::ActiveCall {
 public:
  explicit ActiveCall(Module& m) : module_(m), outermost_(tCallDepth == 0) {
    ++tCallDepth;
    ++module_.activeCalls_;
  }
  ~ActiveCall() {
    --tCallDepth;
    --module_.activeCalls_;
  }
  ActiveCall(const ActiveCall&) = delete;
  ActiveCall& operator=(const ActiveCall&) = delete;
  bool outermost() const { return outermost_; }
  bool reentered() const { return module_.activeCalls_ > 1; }

 private:
  Module& module_;
  bool outermost_;
};

std::vector<Tensor> Module::call(const std::vector<Tensor>& inputs, CallBody body) {
  ActiveCall active(*this);
  if (active.reentered()) return body(inputs);
  // The tree's gradient notices: only for the outermost call of a forward that records a graph.
  bool completeTree = active.outermost() && gradEnabled() && treeHasGradCompleteHooks();
  if (!completeTree && !hasHooks()) return body(inputs);
  return hookedCall(inputs, body, completeTree);
}

std::vector<Tensor> Module::hookedCall(const std::vector<Tensor>& inputs, CallBody body, bool completeTree) {
  // Hooks are read by index: one may register more while it runs.
  for (size_t i = 0; i < forwardPreHooks_.size(); ++i) forwardPreHooks_[i](*this, inputs);
  std::vector<Tensor> in = inputs;
  if (!backwardHooks_.empty()) {
    in = autograd::withBackwardHook(in, [this] {
      for (size_t i = 0; i < backwardHooks_.size(); ++i) backwardHooks_[i](*this);
    });
  }
  std::vector<Tensor> out = body(in);
  for (size_t i = 0; i < forwardHooks_.size(); ++i) forwardHooks_[i](*this, inputs, out);
  if (!backwardPreHooks_.empty() || completeTree) {
    out = autograd::withBackwardHook(out, [this, completeTree] {
      for (size_t i = 0; i < backwardPreHooks_.size(); ++i) backwardPreHooks_[i](*this);
      if (completeTree) autograd::queueEndOfBackwardCallback([this] { completeTreeGradients(); });
    });
  }
  return out;
}

bool Module::hasHooks() const {
  return !forwardPreHooks_.empty() || !forwardHooks_.empty() || !backwardPreHooks_.empty() ||
         !backwardHooks_.empty();
}

bool Module::treeHasGradCompleteHooks() const {
  for (const auto& [name, p] : parameters_)
    if (!p.impl().autograd.gradCompleteHooks.empty()) return true;
  for (const auto& [name, child] : children_)
    if (child->treeHasGradCompleteHooks()) return true;
  return false;
}

void Module::completeTreeGradients() const {
  for (const auto& [name, p] : parameters_) autograd::completeGradient(p);
  for (const auto& [name, child] : children_) child->completeTreeGradients();
}

std::vector<Tensor> Module::forward(const std::vector<Tensor>& inputs) {
  if (recompute_ && gradEnabled())
    return call(inputs, [this](const std::vector<Tensor>& in) {
      return checkpoint([this](const std::vector<Tensor>& again) { return forwardImpl(again); }, in);
    });
  return call(inputs, [this](const std::vector<Tensor>& in) { return forwardImpl(in); });
}

Tensor Module::operator()(const Tensor& input) {
  std::vector<Tensor> out = forward({input});
  STRATA_CHECK(!out.empty(), "module returned no outputs");
  return out[0];
}

std::vector<Tensor> fusedCall(const std::vector<Module*>& modules, const std::vector<Tensor>& inputs,
                              CallBody body) {
  // Each level runs the rest inside its own call.
  auto nest = [&](auto& self, size_t level, const std::vector<Tensor>& in) -> std::vector<Tensor> {
    if (level == modules.size()) return body(in);
    return modules[level]->call(
        in, [&](const std::vector<Tensor>& inner) { return self(self, level + 1, inner); });
  };
  return nest(nest, 0, inputs);
}

Tensor& Module::registerParameter(const std::string& name, Tensor tensor, bool requiresGrad) {
  STRATA_CHECK(!name.empty() && name.find('.') == std::string::npos, "invalid parameter name '{}'", name);
  for (auto& [n, t] : parameters_) STRATA_CHECK(n != name, "parameter '{}' registered twice", name);
  if (requiresGrad) tensor.setRequiresGrad(true);
  tensor.setName(name);
  parameters_.emplace_back(name, tensor);
  return parameters_.back().second;
}

Tensor& Module::registerBuffer(const std::string& name, Tensor tensor) {
  STRATA_CHECK(!name.empty() && name.find('.') == std::string::npos, "invalid buffer name '{}'", name);
  buffers_.emplace_back(name, tensor);
  return buffers_.back().second;
}

void Module::addChild(const std::string& name, std::shared_ptr<Module> module) {
  STRATA_CHECK(module != nullptr, "submodule '{}' is null", name);
  for (auto& [n, m] : children_) STRATA_CHECK(n != name, "submodule '{}' registered twice", name);
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : parameters_) out.emplace_back(prefix + name, t);
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", true, buffers, out);
}

std::vector<std::pair<std::string, Tensor>> Module::namedParameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::namedBuffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : namedParameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::namedModules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (auto& [name, child] : children_)
    for (auto& [sub, m] : child->namedModules()) out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

int64_t Module::numParameters() const {
  int64_t n = 0;
  for (auto& [name, t] : namedParameters()) n += t.numel();
  return n;
}

void Module::castParameters(DType dtype) {
  NoGradGuard noGrad;
  materializeParameters(*this);
  std::set<const TensorImpl*> done;
  for (auto& [name, p] : namedParameters()) {
    if (p.dtype() == dtype || !done.insert(&p.impl()).second) continue;
    Tensor converted = ops::to(p.detach(), p.device(), dtype);
    TensorImpl& impl = p.impl();
    impl.storage = converted.storage();
    impl.offset = converted.offset();
    impl.strides = converted.strides();
    impl.dtype = dtype;
    autograd::setGradBuffer(p, Tensor());
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, child] : children_) child->train(on);
}

void Module::zeroGrad() {
  for (auto& [n, t] : namedParameters()) t.setGrad(Tensor());
}

}  // namespace strata::nn
