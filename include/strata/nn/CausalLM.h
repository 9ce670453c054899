// The interface the trainer trains: a next-token model over integer ids. GPT implements it; so can a user's
// own model (see models/custom_example).
//
// logits() and loss() are calls of the module (NOTE [Module calls] in Module.h): they run the hooks around
// the model's logitsImpl() / lossImpl(), which is what a model implements.
#pragma once

#include <optional>
#include <string>

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
  // What the model is, for the trainer's log ("training gpt (...)"): the zoo's architecture, or the name a
  // user's model gives itself; "custom" unless it says.
  virtual std::string name() const { return "custom"; }
  // Training FLOPs per token (forward and backward), from which the trainer and `strata bench` report
  // TFLOP/s and MFU; none (the default) when the model does not count them, and they then report "TFLOP/s
  // unknown". A model counts its GEMMs: a matmul with a weight of n elements costs 2n FLOPs per token
  // forward and 4n backward (the input's and the weight's gradients), so 6 x the parameters in matmuls,
  // plus what is not a parameter's matmul (GPT's attention scores add 12 x layers x width x sequence).
  virtual std::optional<double> flopsPerToken() const { return std::nullopt; }

 protected:
  virtual Tensor logitsImpl(const Tensor& ids, DType compute) = 0;
  // The default runs logitsImpl() and crossEntropy().
  virtual Tensor lossImpl(const Tensor& ids, const Tensor& targets, DType compute);
  // inputs: ids, then optionally targets -> {loss} with targets, {logits} without (in the parameters' dtype).
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;
};

}  // namespace strata::nn
