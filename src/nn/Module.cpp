#include "strata/nn/Module.h"

#include "strata/autograd/Node.h"

namespace strata::nn {

std::vector<Tensor> Module::operator()(const std::vector<Tensor>& inputs) {
  for (auto& h : forwardPreHooks_) h(*this, inputs);
  std::vector<Tensor> in = inputs;
  if (!backwardHooks_.empty()) {
    in = autograd::withBackwardHook(in, [this] {
      for (auto& h : backwardHooks_) h(*this);
    });
  }
  std::vector<Tensor> out = forward(in);
  for (auto& h : forwardHooks_) h(*this, inputs, out);
  if (!backwardPreHooks_.empty()) {
    out = autograd::withBackwardHook(out, [this] {
      for (auto& h : backwardPreHooks_) h(*this);
    });
  }
  return out;
}

Tensor Module::operator()(const Tensor& input) {
  std::vector<Tensor> out = (*this)(std::vector<Tensor>{input});
  STRATA_CHECK(!out.empty(), "module returned no outputs");
  return out[0];
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

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, child] : children_) child->train(on);
}

void Module::zeroGrad() {
  for (auto& [n, t] : namedParameters()) t.setGrad(Tensor());
}

}  // namespace strata::nn
