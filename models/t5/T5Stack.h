// A T5 encoder or decoder stack: the relative position bias (computed once per forward and shared by every
// block, as HF's T5 computes it in block 0 and hands it on), the blocks, and the final T5 LayerNorm. The
// token embedding belongs to the model (shared by both stacks). Module names: "relative_bias", "block.<i>",
// "final_norm".
#pragma once

#include "models/t5/T5Block.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/RelativePositionBias.h"

namespace strata::models {

struct T5StackConfig {
  T5BlockConfig block;
  // Switch Transformers: the blocks whose feed-forward is block.moe (the others take block.ff).
  std::vector<bool> sparse;
  int64_t numLayers = 0;
  nn::RelativePositionBiasConfig relativeBias;
  double dropout = 0.0;  // on the embedded input and on the final output
};

class T5Stack : public nn::Module {
 public:
  T5Stack(const T5StackConfig& config, Generator& gen);
  // x: embedded tokens [B, S, C]; keyPadding [B, S] or undefined; memory and memoryPadding for a decoder.
  // -> final-normed hidden states [B, S, C].
  Tensor apply(const Tensor& x, const Tensor& keyPadding, const Tensor& memory = Tensor(),
               const Tensor& memoryPadding = Tensor());

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  T5StackConfig config_;
  std::shared_ptr<nn::RelativePositionBias> bias_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::RMSNorm> finalNorm_;
};

}  // namespace strata::models
