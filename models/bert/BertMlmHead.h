// BERT's masked-LM head: transform (dense, GELU, LayerNorm), then the decoder tied to the word embeddings
// with a bias of its own. Modules "transform" and "ln", parameter "bias"; HF's cls.predictions.*.
#pragma once

#include "strata/nn/Embedding.h"
#include "strata/nn/Linear.h"
#include "strata/nn/Norm.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::models {

struct BertMlmHeadConfig {
  int64_t hiddenSize = 0;
  int64_t vocabSize = 0;
  nn::Activation activation = nn::Activation::GeluErf;
  double layerNormEps = 1e-12;
  double initStd = 0.02;
  Device device = Device::cpu();
  // Vocabulary-parallel (NOTE [Tensor parallelism] in nn/TensorParallel.h): the bias holds this rank's part
  // of the vocabulary, like the tied word embeddings; the transform and its norm are whole.
  nn::TensorParallel tensorParallel = {};
};

class BertMlmHead : public nn::Module, public nn::TensorParallelSliced {
 public:
  // `words` is the model's word embedding (registered by the model, not here): the decoder is a second call
  // of it (Embedding::unembed), so its hooks fire around this use too.
  BertMlmHead(const BertMlmHeadConfig& config, std::shared_ptr<nn::Embedding> words, Generator& gen);
  // hidden [..., C] -> logits [..., vocab] in the parameters' dtype (vocabulary-parallel: the ranks' columns
  // gathered).
  Tensor apply(const Tensor& hidden);
  // The mean cross-entropy of apply(hidden) against labels (shaped like hidden's rows; -100: no loss), fp32;
  // vocabulary-parallel, from this rank's columns without gathering them (vocabParallelCrossEntropy).
  Tensor loss(const Tensor& hidden, const Tensor& labels);

  Tensor bias;  // [vocab]; vocabulary-parallel: [vocab / T]

  std::map<std::string, nn::TensorSlice> ownSlices() const override;

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  BertMlmHeadConfig config_;
  std::shared_ptr<nn::Embedding> words_;
  std::shared_ptr<nn::Linear> transform_;
  std::shared_ptr<nn::LayerNorm> ln_;

  // This rank's logits [..., vocab / T] (all of them unsplit), bias added.
  Tensor logitsHere(const Tensor& hidden);
};

}  // namespace strata::models
