// y = x W + b with W stored [in, out] (the layout HF's GPT-2 Conv1D uses, so checkpoints map one to one).
// The parameters are in the compute dtype (bf16 when training in bf16: views into the model's chunks, whose
// fp32 masters the optimizer keeps); their gradients accumulate in fp32 buffers.
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

}  // namespace strata::nn
