// Linear, Embedding, LayerNorm, RMSNorm and Dropout.
#include "strata/autograd/Functions.h"
#include "strata/nn/Dropout.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/Linear.h"
#include "strata/nn/Norm.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

Tensor castParameter(const Tensor& parameter, DType dtype) {
  return parameter.dtype() == dtype ? parameter : parameter.to(dtype);
}

Tensor computeParameter(const Tensor& parameter, DType compute) {
  if (!parameter.defined()) return parameter;
  bool mixed = parameter.dtype() == DType::F32 && (compute == DType::BF16 || compute == DType::F16);
  return mixed ? parameter : castParameter(parameter, compute);
}

Linear::Linear(const LinearConfig& config, Generator& gen) {
  STRATA_CHECK(config.inFeatures > 0 && config.outFeatures > 0,
               "Linear: sizes must be positive, got {} -> {}", config.inFeatures, config.outFeatures);
  weight = registerParameter("weight", ops::randn({config.inFeatures, config.outFeatures}, gen, DType::F32,
                                                  config.device, 0, config.initStd));
  if (config.bias)
    bias = registerParameter("bias", ops::zeros({config.outFeatures}, DType::F32, config.device));
}

Tensor Linear::apply(const Tensor& x) {
  // fp32 masters with bf16/f16 input go in as they are: linear() casts them for the GEMM and returns fp32
  // gradients straight from it.
  return linear(x, computeParameter(weight, x.dtype()), computeParameter(bias, x.dtype()));
}

std::vector<Tensor> Linear::forward(const std::vector<Tensor>& inputs) {
  return {apply(inputs.at(0))};
}

Embedding::Embedding(const EmbeddingConfig& config, Generator& gen) {
  STRATA_CHECK(config.numEmbeddings > 0 && config.embeddingDim > 0, "Embedding: sizes must be positive");
  weight = registerParameter("weight", ops::randn({config.numEmbeddings, config.embeddingDim}, gen,
                                                  DType::F32, config.device, 0, config.initStd));
}

Tensor Embedding::apply(const Tensor& ids, DType dtype) {
  // fp32 masters with a 16-bit compute dtype: gather fp32 rows and cast only those; the backward scatters
  // into an fp32 gradient directly (no [V, C] cast either way).
  if (weight.dtype() == DType::F32 && (dtype == DType::BF16 || dtype == DType::F16))
    return embedding(weight, ids).to(dtype);
  return embedding(castParameter(weight, dtype), ids);
}

std::vector<Tensor> Embedding::forward(const std::vector<Tensor>& inputs) {
  return {apply(inputs.at(0), weight.dtype())};
}

LayerNorm::LayerNorm(const NormConfig& config) : eps_(config.eps) {
  weight = registerParameter("weight", ops::ones({config.dim}, DType::F32, config.device));
  if (config.bias) bias = registerParameter("bias", ops::zeros({config.dim}, DType::F32, config.device));
}

Tensor LayerNorm::apply(const Tensor& x) {
  return layerNorm(x, computeParameter(weight, x.dtype()), computeParameter(bias, x.dtype()), eps_);
}

std::array<Tensor, 2> LayerNorm::applyResidual(const Tensor& x, const Tensor& residual) {
  return addLayerNorm(x, residual, computeParameter(weight, x.dtype()), computeParameter(bias, x.dtype()),
                      eps_);
}

std::vector<Tensor> LayerNorm::forward(const std::vector<Tensor>& inputs) {
  if (inputs.size() > 1) {
    if (!inputs[1].defined()) return {apply(inputs[0]), inputs[0]};  // a zero residual
    auto [sum, y] = applyResidual(inputs[0], inputs[1]);
    return {y, sum};
  }
  return {apply(inputs.at(0))};
}

RMSNorm::RMSNorm(const NormConfig& config) : eps_(config.eps) {
  weight = registerParameter("weight", ops::ones({config.dim}, DType::F32, config.device));
}

Tensor RMSNorm::apply(const Tensor& x) {
  return rmsNorm(x, computeParameter(weight, x.dtype()), eps_);
}

std::vector<Tensor> RMSNorm::forward(const std::vector<Tensor>& inputs) {
  return {apply(inputs.at(0))};
}

Tensor Dropout::apply(const Tensor& x) {
  return dropout(x, p_, isTraining());
}

std::vector<Tensor> Dropout::forward(const std::vector<Tensor>& inputs) {
  return {apply(inputs.at(0))};
}

}  // namespace strata::nn
