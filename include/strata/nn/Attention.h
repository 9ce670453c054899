// Multi-head attention for the Transformer family.
//
// One class covers the three uses: causal self-attention (GPT), bidirectional self-attention with a key
// padding mask (BERT), and cross-attention to an encoder's output (T5, `cross = true`). An additive bias
// broadcastable to [B, H, S_q, S_k] (T5's relative positions) can be passed with each call.
#pragma once

#include "strata/autograd/Functions.h"
#include "strata/nn/Linear.h"

namespace strata::nn {

struct AttentionConfig {
  int64_t hiddenSize = 0;
  int64_t numHeads = 0;
  bool causal = true;
  bool cross = false;  // queries from x, keys and values from a separate memory
  bool bias = true;
  double dropout = 0.0;  // on attention probabilities and on the output
  double initStd = 0.02;
  double outInitStd = 0.02;  // GPT-2 scales the residual projection by 1/sqrt(2 * layers)
  Device device = Device::cpu();
  // Per-head width; 0 means hiddenSize / numHeads. T5 v1.1 sets it apart from the model width (t5-v1_1-small:
  // 6 heads of 64 on a 512-wide model), so the projections are hiddenSize -> numHeads * headDim and back.
  int64_t headDim = 0;
  // Multiplies q k^T; 0 means 1/sqrt(headDim). T5 uses 1 (its q projection's initialisation carries the
  // scale).
  double scale = 0.0;
  // Split by heads over a tensor-parallel group (NOTE [Tensor parallelism] in nn/TensorParallel.h): this
  // rank's q/k/v of heads [rank H / T, (rank + 1) H / T) (column-parallel), and the output projection's rows
  // for them (row-parallel); cross-attention's q and fused k|v likewise (k|v in two groups). A bias passed
  // with a call (T5's relative positions) must then be this rank's heads' [.., H / T, S, S_k].
  TensorParallel tensorParallel = {};

  int64_t headWidth() const { return headDim > 0 ? headDim : hiddenSize / numHeads; }
  int64_t innerSize() const { return numHeads * headWidth(); }
  int64_t localHeads() const { return numHeads / tensorParallel.size; }
};

class Attention : public Module {
 public:
  Attention(const AttentionConfig& config, Generator& gen);
  // forward inputs: x [B, S, C], then optionally memory [B, S_k, C] (cross), key padding [B, S_k] (non-zero:
  // ignore that key), bias (broadcastable to [B, H, S, S_k]).
  // apply(x, memory, extra) is forward({x, memory, extra.keyPadding, extra.bias}); extra.causal is ignored
  // (config.causal decides).
  Tensor apply(const Tensor& x, const Tensor& memory = Tensor(), const AttentionMask& extra = {});

  const AttentionConfig& config() const { return config_; }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  Tensor compute(const Tensor& x, const Tensor& memory, const AttentionMask& extra);

  AttentionConfig config_;
  std::shared_ptr<Linear> qkv_, q_, kv_, proj_;
};

}  // namespace strata::nn
