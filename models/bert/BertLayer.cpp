#include "models/bert/BertLayer.h"

namespace strata::models {

BertLayer::BertLayer(const BertLayerConfig& config, Generator& gen) {
  STRATA_CHECK(!config.attention.causal && !config.attention.cross, "a BERT layer attends bidirectionally");
  nn::NormConfig norm{config.attention.hiddenSize, config.layerNormEps, true, config.attention.device};
  attn_ = registerModule("attn", std::make_shared<nn::Attention>(config.attention, gen));
  ln1_ = registerModule("ln_1", std::make_shared<nn::LayerNorm>(norm));
  mlp_ = registerModule("mlp", std::make_shared<nn::Mlp>(config.mlp, gen));
  ln2_ = registerModule("ln_2", std::make_shared<nn::LayerNorm>(norm));
}

Tensor BertLayer::apply(const Tensor& x, const Tensor& keyPadding) {
  return forward({x, keyPadding})[0];
}

std::vector<Tensor> BertLayer::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  AttentionMask mask;
  if (inputs.size() > 1) mask.keyPadding = inputs[1];
  // Post-LN: each norm takes the residual sum, fused into it (LayerNorm's {y, x + residual} form), and its
  // output is the stream. The sublayers compute in their parameters' dtype (read from the module, so a
  // recomputed forward sees the same) and their outputs join the stream in its dtype: fp32 beside 16-bit
  // parameters with NOTE [BERT's fp32 residual stream].
  DType stream = x.dtype(), compute = mlp_->parameters().front().dtype();
  Tensor h = (*ln1_)(std::vector<Tensor>{attn_->apply(x.to(compute), Tensor(), mask).to(stream), x})[0];
  return {(*ln2_)(std::vector<Tensor>{mlp_->apply(h.to(compute)).to(stream), h})[0]};
}

}  // namespace strata::models
