#include "strata/nn/CausalLM.h"

#include "strata/autograd/Functions.h"

namespace strata::nn {

Tensor CausalLM::loss(const Tensor& ids, const Tensor& targets, DType compute) {
  Tensor lg = logits(ids, compute);
  return crossEntropy(lg.reshape({-1, lg.size(-1)}), targets.reshape({-1}));
}

double CausalLM::flopsPerToken() const {
  return 6.0 * double(numParameters());
}

std::vector<Tensor> CausalLM::forward(const std::vector<Tensor>& inputs) {
  DType compute = parameters().empty() ? DType::F32 : parameters()[0].dtype();
  if (inputs.size() > 1 && inputs[1].defined()) return {loss(inputs[0], inputs[1], compute)};
  return {logits(inputs.at(0), compute)};
}

}  // namespace strata::nn
