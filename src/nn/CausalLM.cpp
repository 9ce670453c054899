#include "strata/nn/CausalLM.h"

#include "strata/autograd/Functions.h"

namespace strata::nn {

Tensor CausalLM::logits(const Tensor& ids, DType compute) {
  return call({ids}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{logitsImpl(in[0], compute)};
  })[0];
}

Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets, DType compute) {
  return call({ids, targets}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{lossImpl(in[0], in[1], compute)};
  })[0];
}

Tensor CausalLM::lossImpl(const Tensor& ids, const Tensor& targets, DType compute) {
  Tensor lg = logitsImpl(ids, compute);
  return crossEntropy(lg.reshape({-1, lg.size(-1)}), targets.reshape({-1}));
}

std::vector<Tensor> CausalLM::forwardImpl(const std::vector<Tensor>& inputs) {
  DType compute = parameters().empty() ? DType::F32 : parameters()[0].dtype();
  if (inputs.size() > 1 && inputs[1].defined()) return {lossImpl(inputs[0], inputs[1], compute)};
  return {logitsImpl(inputs.at(0), compute)};
}

}  // namespace strata::nn
