// The pre-LN Transformer block: x + attn(ln1(x)), then + mlp(ln2(x)), with a GELU MLP.
#pragma once

#include "strata/nn/Attention.h"
#include "strata/nn/Norm.h"

namespace strata::nn {

struct MlpConfig {
  int64_t hiddenSize = 0;
  int64_t ffnHiddenSize = 0;
  bool bias = true;
  double dropout = 0.0;
  double initStd = 0.02;
  double outInitStd = 0.02;
  Device device = Device::cpu();
};

class Mlp : public Module {
 public:
  Mlp(const MlpConfig& config, Generator& gen);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x);

 private:
  MlpConfig config_;
  std::shared_ptr<Linear> fc_, proj_;
};

struct TransformerBlockConfig {
  AttentionConfig attention;
  MlpConfig mlp;
  double layerNormEps = 1e-5;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(const TransformerBlockConfig& config, Generator& gen);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x, const AttentionMask& mask = {});

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace strata::nn
