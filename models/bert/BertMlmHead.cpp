#include "models/bert/BertMlmHead.h"

#include "strata/autograd/Functions.h"
#include "strata/ops/Ops.h"

namespace strata::models {

BertMlmHead::BertMlmHead(const BertMlmHeadConfig& config, std::shared_ptr<nn::Embedding> words,
                         Generator& gen)
    : config_(config), words_(std::move(words)) {
  transform_ = registerModule(
      "transform",
      std::make_shared<nn::Linear>(
          nn::LinearConfig{config.hiddenSize, config.hiddenSize, true, config.initStd, config.device}, gen));
  ln_ = registerModule("ln", std::make_shared<nn::LayerNorm>(nn::NormConfig{
                                 config.hiddenSize, config.layerNormEps, true, config.device}));
  bias = registerParameter("bias", ops::zeros({config.vocabSize}, DType::F32, config.device));
}

Tensor BertMlmHead::apply(const Tensor& hidden) {
  return (*this)(hidden);
}

std::vector<Tensor> BertMlmHead::forwardImpl(const std::vector<Tensor>& inputs) {
  Tensor h = transform_->apply(inputs.at(0));
  switch (config_.activation) {
    case nn::Activation::GeluErf:
      h = gelu(h, GeluApprox::None);
      break;
    case nn::Activation::GeluTanh:
      h = gelu(h, GeluApprox::Tanh);
      break;
    case nn::Activation::Relu:
      h = relu(h);
      break;
  }
  h = ln_->apply(h);
  return {words_->unembed(h, h.dtype()) + bias};
}

}  // namespace strata::models
