// The pre-LN Transformer block: h = x + attn(ln1(x)), then h + mlp(ln2(h)), with a GELU MLP.
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

// forward({x}) -> {block(x)}. forward({x, pending}) -> {x', pending'} runs the block on a residual stream
// held as two tensors whose sum is the stream (pending may be undefined: zero). The adds are left to the
// norms: ln_1 fuses x + pending, ln_2 fuses the attention residual, and the MLP output is handed on as
// pending' for the next block's ln_1 (or the final norm) to fuse. block(x) = x' + pending' for pending = 0.
class TransformerBlock : public Module {
 public:
  TransformerBlock(const TransformerBlockConfig& config, Generator& gen);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  Tensor apply(const Tensor& x, const AttentionMask& mask = {});
  // {x', pending'} as described above.
  std::array<Tensor, 2> applyStream(const Tensor& x, const Tensor& pending, const AttentionMask& mask = {});

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

}  // namespace strata::nn
