#include "models/t5/T5Block.h"

#include "strata/autograd/Functions.h"

namespace strata::models {

T5Block::T5Block(const T5BlockConfig& config, Generator& gen) : config_(config) {
  nn::NormConfig norm{config.selfAttention.hiddenSize, config.layerNormEps, false,
                      config.selfAttention.device};
  attnNorm_ = registerModule("attn_norm", std::make_shared<nn::RMSNorm>(norm));
  attn_ = registerModule("attn", std::make_shared<nn::Attention>(config.selfAttention, gen));
  if (config.decoder) {
    STRATA_CHECK(config.crossAttention.cross, "a T5 decoder block's cross-attention must have cross = true");
    crossNorm_ = registerModule("cross_norm", std::make_shared<nn::RMSNorm>(norm));
    cross_ = registerModule("cross", std::make_shared<nn::Attention>(config.crossAttention, gen));
  }
  ffNorm_ = registerModule("ff_norm", std::make_shared<nn::RMSNorm>(norm));
  if (config.moe)
    moe_ = registerModule("ff", std::make_shared<nn::MoE>(*config.moe, gen));
  else
    ff_ = registerModule("ff", std::make_shared<nn::Mlp>(config.ff, gen));
}

Tensor T5Block::apply(const Tensor& x, const Tensor& keyPadding, const Tensor& bias, const Tensor& memory,
                      const Tensor& memoryPadding) {
  if (!config_.decoder) return forward({x, keyPadding, bias})[0];
  return forward({x, keyPadding, bias, memory, memoryPadding})[0];
}

std::vector<Tensor> T5Block::forwardImpl(const std::vector<Tensor>& inputs) {
  auto at = [&](size_t i) { return i < inputs.size() ? inputs[i] : Tensor(); };
  Tensor h = inputs.at(0);
  AttentionMask self;
  self.keyPadding = at(1);
  self.bias = at(2);
  h = h + attn_->apply(attnNorm_->apply(h), Tensor(), self);
  if (config_.decoder) {
    STRATA_CHECK(at(3).defined(), "a T5 decoder block needs the encoder output");
    AttentionMask cross;
    cross.keyPadding = at(4);
    h = h + cross_->apply(crossNorm_->apply(h), at(3), cross);
  }
  Tensor normed = ffNorm_->apply(h);
  return {h + (moe_ ? moe_->apply(normed) : ff_->apply(normed))};
}

}  // namespace strata::models
