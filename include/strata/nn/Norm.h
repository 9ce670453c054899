// LayerNorm (weight and bias) and RMSNorm (weight only) over the last dimension.
#pragma once

#include <array>

#include "strata/nn/Module.h"
#include "strata/nn/TensorParallel.h"

namespace strata::nn {

struct NormConfig {
  int64_t dim = 0;
  double eps = 1e-5;
  bool bias = true;  // LayerNorm only
  Device device = Device::cpu();
  // Under sequence parallelism the norm runs on a part of the sequence and its parameters' gradients are
  // summed over the group (NOTE [Sequence parallelism] in nn/TensorParallel.h).
  TensorParallel tensorParallel = {};
};

// forward({x}) -> {y}; forward({x, residual}) -> {y, x + residual}: the residual add fused into the norm (an
// undefined residual counts as zero).
// fp32 parameters are read as they are by bf16/f16 input (fp32 gradients, no cast passes); 16-bit parameters
// are widened for fp32 input.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(const NormConfig& config);
  Tensor apply(const Tensor& x);
  // {x + residual, layerNorm(x + residual)}.
  std::array<Tensor, 2> applyResidual(const Tensor& x, const Tensor& residual);

  Tensor weight, bias;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  double eps_;
  TensorParallel tensorParallel_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(const NormConfig& config);
  Tensor apply(const Tensor& x);

  Tensor weight;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  double eps_;
};

}  // namespace strata::nn
