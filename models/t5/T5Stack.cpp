#include "models/t5/T5Stack.h"

#include "strata/autograd/Functions.h"

namespace strata::models {

T5Stack::T5Stack(const T5StackConfig& config, Generator& gen) : config_(config) {
  STRATA_USER_CHECK(config.numLayers > 0, "a T5 stack needs at least one layer, got {}", config.numLayers);
  bias_ =
      registerModule("relative_bias", std::make_shared<nn::RelativePositionBias>(config.relativeBias, gen));
  blocks_ = registerModule("block", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < config.numLayers; ++i) {
    T5BlockConfig block = config.block;
    if (size_t(i) >= config.sparse.size() || !config.sparse[size_t(i)]) block.moe.reset();
    STRATA_CHECK(!(size_t(i) < config.sparse.size() && config.sparse[size_t(i)]) || block.moe,
                 "T5 stack: block {} is sparse without a mixture-of-experts config", i);
    blocks_->append(std::make_shared<T5Block>(block, gen));
  }
  const nn::AttentionConfig& a = config.block.selfAttention;
  finalNorm_ = registerModule("final_norm", std::make_shared<nn::RMSNorm>(nn::NormConfig{
                                                a.hiddenSize, config.block.layerNormEps, false, a.device}));
}

Tensor T5Stack::apply(const Tensor& x, const Tensor& keyPadding, const Tensor& memory,
                      const Tensor& memoryPadding) {
  return forward({x, keyPadding, memory, memoryPadding})[0];
}

std::vector<Tensor> T5Stack::forwardImpl(const std::vector<Tensor>& inputs) {
  auto at = [&](size_t i) { return i < inputs.size() ? inputs[i] : Tensor(); };
  Tensor h = inputs.at(0);
  int64_t S = h.size(1);
  bool training = isTraining();
  Tensor bias = bias_->apply(S, S, h.dtype());  // once per forward, for every block
  h = dropout(h, config_.dropout, training);
  for (size_t i = 0; i < blocks_->size(); ++i)
    h = static_cast<T5Block&>(blocks_->at(i)).apply(h, at(1), bias, at(2), at(3));
  return {dropout(finalNorm_->apply(h), config_.dropout, training)};
}

}  // namespace strata::models
