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
};

class BertMlmHead : public nn::Module {
 public:
  // `words` is the model's word embedding (registered by the model, not here): the decoder is a second call
  // of it (Embedding::unembed), so its hooks fire around this use too.
  BertMlmHead(const BertMlmHeadConfig& config, std::shared_ptr<nn::Embedding> words, Generator& gen);
  // hidden [..., C] -> logits [..., vocab] in the parameters' dtype.
  Tensor apply(const Tensor& hidden);

  Tensor bias;  // [vocab]

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  BertMlmHeadConfig config_;
  std::shared_ptr<nn::Embedding> words_;
  std::shared_ptr<nn::Linear> transform_;
  std::shared_ptr<nn::LayerNorm> ln_;
};

}  // namespace strata::models
