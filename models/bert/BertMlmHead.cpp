#include "models/bert/BertMlmHead.h"

#include "strata/autograd/Functions.h"
#include "strata/nn/DeferredInit.h"
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
  const nn::TensorParallel& tp = config.tensorParallel;
  STRATA_CHECK(config.vocabSize % tp.size == 0, "bert MLM head: {} tokens over {} tensor-parallel ranks",
               config.vocabSize, tp.size);
  bias = registerParameter("bias", nn::filledParameter({config.vocabSize / tp.size}, config.device, 0.0));
}

std::map<std::string, nn::TensorSlice> BertMlmHead::ownSlices() const {
  if (!config_.tensorParallel.active()) return {};
  return {{"bias", nn::TensorSlice{0, 1}}};
}

Tensor BertMlmHead::apply(const Tensor& hidden) {
  return (*this)(hidden);
}

Tensor BertMlmHead::loss(const Tensor& hidden, const Tensor& labels) {
  return call({hidden, labels}, [&](const std::vector<Tensor>& in) {
    Tensor logits = logitsHere(in[0]);
    STRATA_CHECK(in[1].numel() * logits.size(-1) == logits.numel(),
                 "bert: MLM labels {} do not match the logits {}", toString(in[1].shape()),
                 toString(logits.shape()));
    Tensor rows = logits.reshape({-1, logits.size(-1)}), target = in[1].reshape({-1});
    if (config_.tensorParallel.active())
      return std::vector<Tensor>{nn::vocabParallelCrossEntropy(rows, target, config_.tensorParallel, -100)};
    return std::vector<Tensor>{crossEntropy(rows, target, -100)};
  })[0];
}

std::vector<Tensor> BertMlmHead::forwardImpl(const std::vector<Tensor>& inputs) {
  return {nn::gatherFromTensorParallel(logitsHere(inputs.at(0)), config_.tensorParallel)};
}

Tensor BertMlmHead::logitsHere(const Tensor& hidden) {
  Tensor h = transform_->apply(hidden);
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
  return words_->unembedHere(h, h.dtype()) + bias;
}

}  // namespace strata::models
