// The interface the trainer trains: a next-token model over integer ids. GPT implements it; so can a user's
// own model (see models/custom_example).
//
// logits() and loss() are calls of the module (NOTE [Module calls] in Module.h): they run the hooks around
// the model's logitsImpl() / lossImpl(), which is what a model implements.
#pragma once

#include "strata/nn/Module.h"

namespace strata::nn {

class CausalLM : public Module {
 public:
  // ids [B, T] (i64) -> logits [B, T, vocab], computed in `compute` (parameters stay in their own dtype).
  Tensor logits(const Tensor& ids, DType compute);
  // Mean next-token cross-entropy against targets [B, T].
  Tensor loss(const Tensor& ids, const Tensor& targets, DType compute);
  // Longest sequence the model takes.
  virtual int64_t contextLength() const = 0;
  virtual int64_t vocabSize() const = 0;
  // Training FLOPs per token (for TFLOP/s and MFU); the default is 6 * parameters.
  virtual double flopsPerToken() const;

 protected:
  virtual Tensor logitsImpl(const Tensor& ids, DType compute) = 0;
  // The default runs logitsImpl() and crossEntropy().
  virtual Tensor lossImpl(const Tensor& ids, const Tensor& targets, DType compute);
  // inputs: ids, then optionally targets -> {loss} with targets, {logits} without (in the parameters' dtype).
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;
};

}  // namespace strata::nn
