// One post-LN BERT encoder layer: h = LN_1(x + attn(x)), then LN_2(h + mlp(h)). Module names: "attn" (qkv,
// proj), "ln_1", "mlp" (fc, proj), "ln_2"; models/bert/BertHf.h maps them onto HF's BertLayer.
//
// NOTE [BERT's fp32 residual stream]
// In a post-LN encoder the stream between the layers is the LayerNorms' output, and each layer adds to it.
// With BertLayerConfig::fp32Residual and 16-bit parameters the stream stays fp32: the attention and the MLP
// read a 16-bit copy of it, their 16-bit outputs are widened, added to the fp32 stream and normalised in
// fp32 (the norms' parameters widened to fp32 as they are read). The gradient along the stream is fp32 too.
// That is what torch.autocast does for HF's BertLayer (its LayerNorms run in fp32 and their outputs stay
// fp32). Without it the stream, and its gradient, are rounded to 16 bits at every layer.
#pragma once

#include "strata/nn/Norm.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::models {

struct BertLayerConfig {
  nn::AttentionConfig attention;  // bidirectional (causal = false)
  nn::MlpConfig mlp;
  double layerNormEps = 1e-12;
  bool fp32Residual = false;  // NOTE [BERT's fp32 residual stream]
};

class BertLayer : public nn::Module {
 public:
  BertLayer(const BertLayerConfig& config, Generator& gen);
  // x [B, S, C]; keyPadding [B, S] (non-zero: a padding position no query attends to) or undefined. x may be
  // fp32 beside 16-bit parameters (fp32Residual); the sublayers compute in their parameters' dtype.
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
