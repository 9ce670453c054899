// LayerNorm (weight and bias) and RMSNorm (weight only) over the last dimension.
#pragma once

#include "strata/nn/Module.h"

namespace strata::nn {

struct NormConfig {
  int64_t dim = 0;
  double eps = 1e-5;
  bool bias = true;  // LayerNorm only
  Device device = Device::cpu();
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(const NormConfig& config);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x);

  Tensor weight, bias;

 private:
  double eps_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(const NormConfig& config);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x);

  Tensor weight;

 private:
  double eps_;
};

}  // namespace strata::nn
