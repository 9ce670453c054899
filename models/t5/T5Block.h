// One T5 block (pre-norm, RMS-style T5 LayerNorm without mean or bias): h = x + attn(norm(x)) with the
// stack's relative position bias, then (decoder) h + cross(norm(h), encoder output), then h + ff(norm(h)).
// Module names: "attn_norm", "attn", "cross_norm", "cross" (decoder only), "ff_norm", "ff" (an MLP, or the
// experts of a Switch Transformers layer: nn::MoE).
#pragma once

#include <optional>

#include "strata/nn/MoE.h"
#include "strata/nn/Norm.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::models {

struct T5BlockConfig {
  nn::AttentionConfig selfAttention;   // causal in the decoder
  nn::AttentionConfig crossAttention;  // used when decoder is true
  nn::MlpConfig ff;
  std::optional<nn::MoEConfig> moe;  // Switch Transformers: the feed-forward is a mixture of experts
  bool decoder = false;
  double layerNormEps = 1e-6;
  // Sublayer dropout is the attention's and the MLP's own (on their outputs; the attention's also on its
  // probabilities), as HF's T5 drops each sublayer's output once before the residual add.
};

class T5Block : public nn::Module {
 public:
  T5Block(const T5BlockConfig& config, Generator& gen);
  // The mixture of experts of a Switch layer; null in a dense one.
  nn::MoE* moe() const { return moe_.get(); }
  // x [B, S, C]; keyPadding [B, S] or undefined; bias [1, H, S, S] (the stack's relative position bias);
  // memory [B, S_e, C] and memoryPadding [B, S_e] (decoder only).
  Tensor apply(const Tensor& x, const Tensor& keyPadding, const Tensor& bias, const Tensor& memory = Tensor(),
               const Tensor& memoryPadding = Tensor());

 protected:
  // forward({x, keyPadding, bias[, memory, memoryPadding]}) -> {y}.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  T5BlockConfig config_;
  std::shared_ptr<nn::RMSNorm> attnNorm_, crossNorm_, ffNorm_;
  std::shared_ptr<nn::Attention> attn_, cross_;
  std::shared_ptr<nn::Mlp> ff_;
  std::shared_ptr<nn::MoE> moe_;
};

}  // namespace strata::models
