// y = x W + b with W stored [in, out]: the transpose of PyTorch's nn.Linear, whose weight is [out, in] (it is
// the layout of HF's GPT-2 Conv1D, so GPT-2 checkpoints map one to one, and x W is a GEMM with no transpose).
// The parameters are in the compute dtype (bf16 when training in bf16: views into the model's chunks, whose
// fp32 masters the optimizer keeps); their gradients accumulate in fp32 buffers.
//
// Where the orientation matters to a user:
// - Weights from PyTorch or from an HF checkpoint of nn.Linear layers (a state_dict, readSafetensors in
//   train/Checkpoint.h) go in transposed: weight = w_torch^T. A square layer (in == out) takes the
//   untransposed weight without a shape error and computes something else. `strata convert --from-hf` and
//   `--hf` transpose for the zoo's models only (models/HfLayout.h, whose HfTensor::transpose a layout of
//   one's own can use with importHf / exportHf); loadCheckpoint refuses a non-square weight of the other
//   shape, naming it.
// - Code of one's own over the weight: linear(x, weight, bias) and geluMlp() in autograd/Functions.h take
//   [in, out], and rows are inputs (a fan-in is weight.size(0), PyTorch's weight.size(1)). Read it inside
//   this layer's call (NOTE [Module calls] in Module.h).
// - LinearConfig's init (normal(0, initStd) per element, zero bias) treats every element alike, so it does
//   not depend on the orientation. An Embedding's table is [num, dim]; its tied use as an output layer
//   (Embedding::unembed) multiplies by its transpose.
#pragma once

#include "strata/autograd/Fp8.h"
#include "strata/core/Generator.h"
#include "strata/nn/Module.h"
#include "strata/nn/TensorParallel.h"

namespace strata::nn {

struct LinearConfig {
  int64_t inFeatures = 0;
  int64_t outFeatures = 0;
  bool bias = true;
  double initStd = 0.02;  // normal(0, initStd) weights, zero bias
  Device device = Device::cpu();
  // Tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): this rank's columns (in
  // `splitGroups` groups: 3 for a fused q|k|v) or rows of the one-rank layer, when tensorParallel is active.
  TensorSplit split = TensorSplit::None;
  int64_t splitGroups = 1;
  TensorParallel tensorParallel = {};
};

// y = x W + b, W [in, out] (PyTorch's nn.Linear weight transposed; see above).
class Linear : public Module {
 public:
  Linear(const LinearConfig& config, Generator& gen);
  // x [..., in] -> [..., out]; the same as forward({x}).
  Tensor apply(const Tensor& x);

  Tensor weight;  // [in, out]: [inFeatures, outFeatures], not PyTorch's [out, in]
  Tensor bias;    // [out]; undefined when config.bias is false
  // Column-parallel: the input goes through f, the weight is [in, out / T] and the bias [out / T].
  // Row-parallel: the weight is [in / T, out], the product goes through g, then the whole bias is added.
  TensorSplit split() const { return tensorParallel_.active() ? split_ : TensorSplit::None; }
  bool splitsOverTensorParallel() const { return split() != TensorSplit::None; }
  const TensorParallel& tensorParallel() const { return tensorParallel_; }
  int64_t splitGroups() const { return splitGroups_; }
  // A row-parallel layer in two calls, for a caller that recomputes the product but must not repeat the
  // collective (a checkpointed MLP tail): this rank's partial product x W (no bias), then its sum over the
  // group (g, or the reduce-scatter under sequence parallelism) plus the whole bias. Unsplit: x W + b, then
  // the identity.
  Tensor applyPartial(const Tensor& x);
  Tensor reducePartial(const Tensor& partial);
  // A column-parallel layer in two steps, for layers that read one input (a gated MLP's gate and up): the
  // input through f (or gathered along the sequence) once, then each layer's product on it, so the input's
  // gradient is all-reduced once, not once per layer. Unsplit: x, then apply.
  Tensor columnInput(const Tensor& x) const;
  Tensor applyToColumnInput(const Tensor& in);
  // FP8 (NOTE [FP8 training] in autograd/Fp8.h): from here on this layer's products run in FP8 with the
  // scales of `state` (enableFp8 sets every layer's).
  void setFp8(std::shared_ptr<autograd::Fp8LinearState> state) { fp8_ = std::move(state); }
  bool fp8() const { return fp8_ != nullptr; }
  const autograd::Fp8LinearState* fp8State() const { return fp8_.get(); }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  // x W (+ b): linear(), or fp8Linear() once FP8 is set.
  Tensor product(const Tensor& x, const Tensor& b) const;
  std::shared_ptr<autograd::Fp8LinearState> fp8_;
  TensorSplit split_ = TensorSplit::None;
  int64_t splitGroups_ = 1;
  TensorParallel tensorParallel_;
};

// Sets every nn::Linear of `model` to run in FP8 (NOTE [FP8 training]), and with `lmHead` every
// nn::Embedding's unembedCrossEntropy (the LM heads), each with a state of its own on `device` in the
// returned scaling, named and saved in the order of model.namedModules().
std::shared_ptr<autograd::Fp8Scaling> enableFp8(Module& model, const autograd::Fp8Recipe& recipe,
                                                Device device, bool lmHead = false);

}  // namespace strata::nn
