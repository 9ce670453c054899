// Dropout as a module: active in train mode, identity in eval mode.
#pragma once

#include "strata/nn/Module.h"

namespace strata::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p) : p_(p) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x);
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace strata::nn
