// An ordered list of submodules named "0", "1", ... (GPT's "h.3.attn..." comes from a ModuleList named "h"),
// or from `firstName` on: a rank's slice of a longer list (its experts under expert parallelism) keeps the
// whole list's names.
#pragma once

#include "strata/nn/Module.h"

namespace strata::nn {

class ModuleList : public Module {
 public:
  explicit ModuleList(int64_t firstName = 0) : firstName_(firstName) {}
  template <class M>
  std::shared_ptr<M> append(std::shared_ptr<M> module) {
    items_.push_back(module);
    return registerModule(std::to_string(firstName_ + int64_t(items_.size()) - 1), std::move(module));
  }
  // Appends `module` under the name `name`: a rank's blocks of a pipeline stage keep the whole model's
  // numbers, with gaps between its model chunks (NOTE [Pipeline stages] in nn/Pipeline.h).
  template <class M>
  std::shared_ptr<M> appendNamed(int64_t name, std::shared_ptr<M> module) {
    items_.push_back(module);
    return registerModule(std::to_string(name), std::move(module));
  }
  size_t size() const { return items_.size(); }
  Module& at(size_t i) { return *items_.at(i); }

 protected:
  // Applies the modules in order.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override {
    std::vector<Tensor> x = inputs;
    for (auto& m : items_) x = (*m)(x);
    return x;
  }

 private:
  int64_t firstName_ = 0;
  std::vector<std::shared_ptr<Module>> items_;
};

}  // namespace strata::nn
