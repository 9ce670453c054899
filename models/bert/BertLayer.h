// One post-LN BERT encoder layer: h = LN_1(x + attn(x)), then LN_2(h + mlp(h)). Module names: "attn" (qkv,
// proj), "ln_1", "mlp" (fc, proj), "ln_2"; models/bert/BertHf.h maps them onto HF's BertLayer.
#pragma once

#include "strata/nn/Norm.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::models {

struct BertLayerConfig {
  nn::AttentionConfig attention;  // bidirectional (causal = false)
  nn::MlpConfig mlp;
  double layerNormEps = 1e-12;
};

class BertLayer : public nn::Module {
 public:
  BertLayer(const BertLayerConfig& config, Generator& gen);
  // x [B, S, C]; keyPadding [B, S] (non-zero: a padding position no query attends to) or undefined.
  Tensor apply(const Tensor& x, const Tensor& keyPadding = Tensor());

 protected:
  // forward({x}) or forward({x, keyPadding}) -> {y}.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<nn::Attention> attn_;
  std::shared_ptr<nn::LayerNorm> ln1_, ln2_;
  std::shared_ptr<nn::Mlp> mlp_;
};

}  // namespace strata::models
