// y = x W + b with W stored [in, out] (the layout HF's GPT-2 Conv1D uses, so checkpoints map one to one).
// Parameters are kept in their own dtype (fp32 masters); forward casts them to the input's dtype, so bf16
// activations run bf16 GEMMs while gradients accumulate in fp32.
#pragma once

#include "strata/core/Generator.h"
#include "strata/nn/Module.h"

namespace strata::nn {

struct LinearConfig {
  int64_t inFeatures = 0;
  int64_t outFeatures = 0;
  bool bias = true;
  double initStd = 0.02;  // normal(0, initStd) weights, zero bias
  Device device = Device::cpu();
};

class Linear : public Module {
 public:
  Linear(const LinearConfig& config, Generator& gen);
  // x [..., in] -> [..., out]; the same as forward({x}).
  Tensor apply(const Tensor& x);

  Tensor weight, bias;  // bias undefined when config.bias is false

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;
};

// A parameter cast to `dtype` for use in a forward pass (differentiable; no copy when it already matches).
Tensor castParameter(const Tensor& parameter, DType dtype);
// A parameter as the fused functions (linear, geluMlp, layerNorm, ...) take it for `compute` input: fp32
// masters as they are under bf16/f16 compute (the functions cast them and return fp32 gradients), otherwise
// castParameter. Undefined stays undefined.
Tensor computeParameter(const Tensor& parameter, DType compute);

}  // namespace strata::nn
