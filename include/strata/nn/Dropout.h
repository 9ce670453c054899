// Dropout as a module: active in train mode, identity in eval mode.
#pragma once

#include "strata/nn/Module.h"

namespace strata::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p) : p_(p) {}
  Tensor apply(const Tensor& x);
  double p() const { return p_; }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  double p_;
};

}  // namespace strata::nn
