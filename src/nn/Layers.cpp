// Linear, Embedding, LayerNorm, RMSNorm and Dropout.
#include "strata/autograd/Functions.h"
#include "strata/nn/Dropout.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/Linear.h"
#include "strata/nn/Norm.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

namespace {
// A layer computes in its parameters' dtype (they are the compute-dtype weights; NOTE [Gradient buffers] in
// strata/autograd/Node.h).
void checkComputeDType(const char* layer, const Tensor& weight, DType compute) {
  STRATA_CHECK(
      weight.dtype() == compute,
      "{}: {} parameters asked to compute in {}; parameters are in the compute dtype (cast the model "
      "with Module::castParameters)",
      layer, weight.dtype(), compute);
}
}  // namespace

Linear::Linear(const LinearConfig& config, Generator& gen) {
  STRATA_CHECK(config.inFeatures > 0 && config.outFeatures > 0,
               "Linear: sizes must be positive, got {} -> {}", config.inFeatures, config.outFeatures);
  weight = registerParameter("weight", ops::randn({config.inFeatures, config.outFeatures}, gen, DType::F32,
                                                  config.device, 0, config.initStd));
  if (config.bias)
    bias = registerParameter("bias", ops::zeros({config.outFeatures}, DType::F32, config.device));
}

Tensor Linear::apply(const Tensor& x) {
  return (*this)(x);
}

std::vector<Tensor> Linear::forwardImpl(const std::vector<Tensor>& inputs) {
  return {linear(inputs.at(0), weight, bias)};
}

Embedding::Embedding(const EmbeddingConfig& config, Generator& gen) : paddingIdx_(config.paddingIdx) {
  STRATA_CHECK(config.numEmbeddings > 0 && config.embeddingDim > 0, "Embedding: sizes must be positive");
  STRATA_CHECK(config.paddingIdx < config.numEmbeddings, "Embedding: padding id {} is past its {} rows",
               config.paddingIdx, config.numEmbeddings);
  weight = registerParameter("weight", ops::randn({config.numEmbeddings, config.embeddingDim}, gen,
                                                  DType::F32, config.device, 0, config.initStd));
}

Tensor Embedding::lookup(const Tensor& ids, DType dtype) {
  checkComputeDType("Embedding", weight, dtype);
  return embedding(weight, ids, paddingIdx_);
}

Tensor Embedding::apply(const Tensor& ids, DType dtype) {
  return call({ids},
              [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{lookup(in[0], dtype)}; })[0];
}

std::vector<Tensor> Embedding::forwardImpl(const std::vector<Tensor>& inputs) {
  return {lookup(inputs.at(0), weight.dtype())};
}

Tensor Embedding::unembed(const Tensor& x, DType compute) {
  return call({x}, [&](const std::vector<Tensor>& in) {
    // A transposed view of the table (no copy).
    checkComputeDType("Embedding::unembed", weight, compute);
    return std::vector<Tensor>{matmul(in[0], weight.transpose(0, 1))};
  })[0];
}

Tensor Embedding::unembedCrossEntropy(const Tensor& x, const Tensor& target) {
  return call({x, target}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{linearCrossEntropy(in[0], weight, in[1])};
  })[0];
}

LayerNorm::LayerNorm(const NormConfig& config) : eps_(config.eps) {
  weight = registerParameter("weight", ops::ones({config.dim}, DType::F32, config.device));
  if (config.bias) bias = registerParameter("bias", ops::zeros({config.dim}, DType::F32, config.device));
}

Tensor LayerNorm::apply(const Tensor& x) {
  return (*this)(x);
}

std::array<Tensor, 2> LayerNorm::applyResidual(const Tensor& x, const Tensor& residual) {
  std::vector<Tensor> out = forward({x, residual});
  return {out[1], out[0]};
}

std::vector<Tensor> LayerNorm::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  // fp32 rows with 16-bit parameters (an fp32 residual stream in a 16-bit model) read the parameters widened.
  bool widen = x.dtype() == DType::F32 && weight.dtype() != DType::F32;
  const Tensor w = widen ? weight.to(DType::F32) : weight;
  const Tensor b = widen && bias.defined() ? bias.to(DType::F32) : bias;
  if (inputs.size() > 1) {
    if (!inputs[1].defined()) return {layerNorm(x, w, b, eps_), x};  // a zero residual
    auto [sum, y] = addLayerNorm(x, inputs[1], w, b, eps_);
    return {y, sum};
  }
  return {layerNorm(x, w, b, eps_)};
}

RMSNorm::RMSNorm(const NormConfig& config) : eps_(config.eps) {
  weight = registerParameter("weight", ops::ones({config.dim}, DType::F32, config.device));
}

Tensor RMSNorm::apply(const Tensor& x) {
  return (*this)(x);
}

std::vector<Tensor> RMSNorm::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  return {rmsNorm(x, weight, eps_)};
}

Tensor Dropout::apply(const Tensor& x) {
  return (*this)(x);
}

std::vector<Tensor> Dropout::forwardImpl(const std::vector<Tensor>& inputs) {
  return {dropout(inputs.at(0), p_, isTraining())};
}

}  // namespace strata::nn
