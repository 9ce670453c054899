// Linear, Embedding, LayerNorm, RMSNorm and Dropout.
#include "strata/autograd/Functions.h"
#include "strata/nn/DeferredInit.h"
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

Linear::Linear(const LinearConfig& config, Generator& gen)
    : split_(config.split), splitGroups_(config.splitGroups), tensorParallel_(config.tensorParallel) {
  STRATA_CHECK(config.inFeatures > 0 && config.outFeatures > 0,
               "Linear: sizes must be positive, got {} -> {}", config.inFeatures, config.outFeatures);
  // The one-rank layer's draws, then this rank's slice of them (NOTE [Tensor parallelism]), made now or where
  // the parameter is laid out (NOTE [Deferred parameters] in nn/DeferredInit.h).
  const TensorParallel& tp = tensorParallel_;
  int64_t biasSize = config.outFeatures;
  Shape shape{config.inFeatures, config.outFeatures};
  if (split() == TensorSplit::Columns) {
    STRATA_CHECK(config.outFeatures % (config.splitGroups * tp.size) == 0,
                 "Linear: {} output features in {} groups do not split over {} tensor-parallel ranks",
                 config.outFeatures, config.splitGroups, tp.size);
    biasSize /= tp.size;
    shape[1] /= tp.size;
  } else if (split() == TensorSplit::Rows) {
    STRATA_CHECK(config.inFeatures % tp.size == 0,
                 "Linear: {} input features do not split over {} tensor-parallel ranks", config.inFeatures,
                 tp.size);
    shape[0] /= tp.size;
  }
  GeneratorState draws{gen.seed(), gen.reserve(uint64_t(config.inFeatures * config.outFeatures))};
  Tensor w = initialParameter(shape, config.device, [config, draws, split = split(), tp] {
    Generator replay(draws);
    Tensor full = ops::randn({config.inFeatures, config.outFeatures}, replay, DType::F32, config.device, 0,
                             config.initStd);
    if (split == TensorSplit::Columns) return columnSlice(full, config.splitGroups, tp.size, tp.rank);
    if (split == TensorSplit::Rows) {
      int64_t rows = config.inFeatures / tp.size;
      return full.narrow(0, rows * tp.rank, rows).clone();
    }
    return full;
  });
  weight = registerParameter("weight", w);
  if (config.bias) bias = registerParameter("bias", filledParameter({biasSize}, config.device, 0.0));
}

Tensor Linear::apply(const Tensor& x) {
  return (*this)(x);
}

Tensor Linear::product(const Tensor& x, const Tensor& b) const {
  return fp8_ ? fp8Linear(x, weight, b, *fp8_) : linear(x, weight, b);
}

std::shared_ptr<autograd::Fp8Scaling> enableFp8(Module& model, const autograd::Fp8Recipe& recipe,
                                                Device device, bool lmHead) {
  std::shared_ptr<autograd::Fp8Scaling> scaling = autograd::Fp8Scaling::create(recipe, device);
  for (auto& [name, module] : model.namedModules()) {
    if (auto* layer = dynamic_cast<Linear*>(module)) layer->setFp8(scaling->add(name));
    if (auto* table = dynamic_cast<Embedding*>(module); table && lmHead) table->setFp8(scaling->add(name));
  }
  return scaling;
}

Tensor Linear::applyPartial(const Tensor& x) {
  if (split() != TensorSplit::Rows) return apply(x);
  return call(
      {x}, [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{product(in[0], Tensor())}; })[0];
}

Tensor Linear::reducePartial(const Tensor& partial) {
  if (split() != TensorSplit::Rows) return partial;
  return call({partial}, [&](const std::vector<Tensor>& in) {
    Tensor y = tensorParallel_.splitsSequence() ? scatterSequence(in[0], tensorParallel_, in[0].dim() - 2)
                                                : reduceFromTensorParallel(in[0], tensorParallel_);
    return std::vector<Tensor>{bias.defined() ? y + sequenceParallelParameter(bias, tensorParallel_) : y};
  })[0];
}

Tensor Linear::columnInput(const Tensor& x) const {
  if (split() != TensorSplit::Columns) return x;
  // NOTE [Sequence parallelism]: the sequence gathered in place of f.
  return tensorParallel_.splitsSequence() ? gatherSequence(x, tensorParallel_, x.dim() - 2)
                                          : copyToTensorParallel(x, tensorParallel_);
}

Tensor Linear::applyToColumnInput(const Tensor& in) {
  if (split() != TensorSplit::Columns) return apply(in);
  return call({in},
              [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{product(x[0], bias)}; })[0];
}

std::vector<Tensor> Linear::forwardImpl(const std::vector<Tensor>& inputs) {
  switch (split()) {
    case TensorSplit::Columns:
      return {product(columnInput(inputs.at(0)), bias)};
    case TensorSplit::Rows: {
      Tensor partial = product(inputs.at(0), Tensor());
      Tensor y = tensorParallel_.splitsSequence()
                     ? scatterSequence(partial, tensorParallel_, partial.dim() - 2)
                     : reduceFromTensorParallel(partial, tensorParallel_);
      return {bias.defined() ? y + sequenceParallelParameter(bias, tensorParallel_) : y};
    }
    case TensorSplit::None:
      break;
  }
  return {product(inputs.at(0), bias)};
}

Embedding::Embedding(const EmbeddingConfig& config, Generator& gen)
    : paddingIdx_(config.paddingIdx), tensorParallel_(config.tensorParallel) {
  STRATA_CHECK(config.numEmbeddings > 0 && config.embeddingDim > 0, "Embedding: sizes must be positive");
  STRATA_CHECK(config.paddingIdx < config.numEmbeddings, "Embedding: padding id {} is past its {} rows",
               config.paddingIdx, config.numEmbeddings);
  const TensorParallel& tp = tensorParallel_;
  int64_t rows = config.numEmbeddings;
  if (vocabParallel()) {
    STRATA_CHECK(config.numEmbeddings % tp.size == 0,
                 "Embedding: {} rows do not split over {} tensor-parallel ranks", config.numEmbeddings,
                 tp.size);
    rows /= tp.size;
  }
  // The one-rank table's draws, then this rank's rows of them.
  GeneratorState draws{gen.seed(), gen.reserve(uint64_t(config.numEmbeddings * config.embeddingDim))};
  Tensor table = initialParameter({rows, config.embeddingDim}, config.device, [config, draws, rows, tp] {
    Generator replay(draws);
    Tensor full = ops::randn({config.numEmbeddings, config.embeddingDim}, replay, DType::F32, config.device,
                             0, config.initStd);
    return rows == config.numEmbeddings ? full : full.narrow(0, rows * tp.rank, rows).clone();
  });
  weight = registerParameter("weight", table);
}

Tensor Embedding::lookup(const Tensor& ids, DType dtype) {
  checkComputeDType("Embedding", weight, dtype);
  if (!vocabParallel()) return embedding(weight, ids, paddingIdx_);
  // The ids this rank holds read their rows, the others row 0, masked to zero; g sums the ranks' rows.
  int64_t rows = weight.size(0), first = rows * tensorParallel_.rank;
  Device device = ids.device();
  Tensor id = ops::to(ids, device, DType::F32);  // exact below 2^24 ids
  Tensor held = ops::mul(ops::gt(id, ops::full({}, double(first) - 0.5, DType::F32, device)),
                         ops::gt(ops::full({}, double(first + rows) - 0.5, DType::F32, device), id));
  Tensor local = ops::to(ops::mul(ops::affine(id, 1, -double(first)), held), device, DType::I64);
  Shape maskShape = ids.shape();
  maskShape.push_back(1);
  // The padding id's row, on the rank holding it, adds nothing to the gradient (ids held elsewhere read row 0
  // times zero, which adds nothing either).
  int64_t padHere = paddingIdx_ >= first && paddingIdx_ < first + rows ? paddingIdx_ - first : -1;
  Tensor rowsHere = embedding(weight, local, padHere) * ops::to(held, device, dtype).view(maskShape);
  // NOTE [Sequence parallelism]: each rank keeps its part of the sequence of the sum.
  if (tensorParallel_.splitsSequence()) return scatterSequence(rowsHere, tensorParallel_, ids.dim() - 1);
  return reduceFromTensorParallel(rowsHere, tensorParallel_);
}

Tensor Embedding::apply(const Tensor& ids, DType dtype) {
  return call({ids},
              [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{lookup(in[0], dtype)}; })[0];
}

std::vector<Tensor> Embedding::forwardImpl(const std::vector<Tensor>& inputs) {
  return {lookup(inputs.at(0), weight.dtype())};
}

Tensor Embedding::unembed(const Tensor& x, DType compute) {
  return gatherFromTensorParallel(unembedHere(x, compute), tensorParallel_);
}

Tensor Embedding::unembedHere(const Tensor& x, DType compute) {
  return call({x}, [&](const std::vector<Tensor>& in) {
    // A transposed view of the table (no copy).
    checkComputeDType("Embedding::unembed", weight, compute);
    return std::vector<Tensor>{matmul(vocabParallel() ? headInput(in[0]) : in[0], weight.transpose(0, 1))};
  })[0];
}

Tensor Embedding::unembedCrossEntropy(const Tensor& x, const Tensor& target) {
  return call({x, target}, [&](const std::vector<Tensor>& in) {
    if (vocabParallel()) {
      Tensor logits = matmul(headInput(in[0]), weight.transpose(0, 1));
      return std::vector<Tensor>{vocabParallelCrossEntropy(logits, in[1], tensorParallel_)};
    }
    return std::vector<Tensor>{linearCrossEntropy(in[0], weight, in[1], -100, 0, fp8_.get())};
  })[0];
}

Tensor Embedding::headInput(const Tensor& x) const {
  // NOTE [Sequence parallelism]: the rows of every rank's part of the sequence (x [..., S/T, dim]), in
  // place of f.
  if (tensorParallel_.splitsSequence()) return gatherSequence(x, tensorParallel_, x.dim() - 2);
  return copyToTensorParallel(x, tensorParallel_);
}

LayerNorm::LayerNorm(const NormConfig& config) : eps_(config.eps), tensorParallel_(config.tensorParallel) {
  weight = registerParameter("weight", filledParameter({config.dim}, config.device, 1.0));
  if (config.bias) bias = registerParameter("bias", filledParameter({config.dim}, config.device, 0.0));
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
  // NOTE [Sequence parallelism]: on a part of the sequence the parameters' gradients are summed over the
  // group.
  Tensor weightHere = sequenceParallelParameter(weight, tensorParallel_);
  Tensor biasHere = sequenceParallelParameter(bias, tensorParallel_);
  const Tensor w = widen ? weightHere.to(DType::F32) : weightHere;
  const Tensor b = widen && biasHere.defined() ? biasHere.to(DType::F32) : biasHere;
  if (inputs.size() > 1) {
    if (!inputs[1].defined()) return {layerNorm(x, w, b, eps_), x};  // a zero residual
    auto [sum, y] = addLayerNorm(x, inputs[1], w, b, eps_);
    return {y, sum};
  }
  return {layerNorm(x, w, b, eps_)};
}

RMSNorm::RMSNorm(const NormConfig& config) : eps_(config.eps) {
  weight = registerParameter("weight", filledParameter({config.dim}, config.device, 1.0));
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
