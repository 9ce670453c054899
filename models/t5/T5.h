// T5 encoder-decoder, v1.0 and v1.1. The token embedding "shared" feeds both stacks ("encoder", "decoder":
// models/t5/T5Stack.h); the LM head is either tied to it or a table of its own, "lm_head", and the decoder
// output is scaled by d_model^-0.5 before it or not: v1.0 is tied and scaled, v1.1 untied and unscaled (as
// transformers 4.x has it; 5.x ties every T5 head, and its v1.1 is tied and unscaled). v1.0 uses a ReLU
// feed-forward, v1.1 the gated GELU. Attention is unscaled (the q projection's initialisation carries
// 1/sqrt(d_kv)) and has no biases. models/t5/T5Hf.h maps the names onto HF's T5ForConditionalGeneration.
//
// Masks follow HF: attention masks are 1 for a token and 0 for padding (undefined: none); labels are -100
// where no loss is taken.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/t5/T5Stack.h"
#include "strata/nn/Embedding.h"

namespace strata::models {

struct T5Config {
  int64_t numLayers = 6;
  int64_t numDecoderLayers = 0;  // 0 means numLayers
  int64_t hiddenSize = 512;      // d_model
  int64_t numHeads = 8;
  int64_t headDim = 64;  // d_kv
  int64_t ffnHiddenSize = 2048;
  int64_t vocabSize = 32128;
  int64_t relativeAttentionNumBuckets = 32;
  int64_t relativeAttentionMaxDistance = 128;
  int64_t seqLength = 512;         // encoder input (FLOPs per token are counted per input token)
  int64_t decoderSeqLength = 128;  // decoder target
  double dropout = 0.1;
  double layerNormEps = 1e-6;
  double initFactor = 1.0;  // HF's initializer_factor
  bool gatedGelu = false;   // v1.1's gated-gelu feed-forward (v1.0: ReLU)
  bool tieWordEmbeddings = true;
  // The decoder output times d_model^-0.5 before the head: v1.0 (tied), and transformers 5.x's v1.1 is tied
  // and unscaled (HF's scale_decoder_outputs).
  bool scaleDecoderOutputs = true;
  // Switch Transformers (model.moe_*; nn/MoE.h): with moeNumExperts > 0, block i of each stack has
  // moeNumExperts ReLU experts as its feed-forward when i % moeEvery == 1 (every block for moeEvery 1), HF's
  // rule for encoder_sparse_step and decoder_sparse_step.
  int64_t moeNumExperts = 0, moeTopK = 1, moeEvery = 2;
  double moeCapacityFactor = 1.25, moeEvalCapacityFactor = 2.0, moeAuxLossCoef = 0.01, moeZLossCoef = 0.001;
  nn::ExpertParallel expertParallel;
  // Megatron's tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): the heads of every
  // attention (self and cross) and of the relative position bias, the feed-forward's width (each expert's)
  // and the vocabulary of the shared embedding and the head split over the group. No sequence parallelism.
  nn::TensorParallel tensorParallel;
  uint64_t seed = 1234;
  Device device = Device::cpu();

  // The published shapes (t5-small, google/t5-v1_1-small).
  static T5Config v1_0();
  static T5Config v1_1();

  int64_t decoderLayers() const { return numDecoderLayers > 0 ? numDecoderLayers : numLayers; }
  int64_t innerSize() const { return numHeads * headDim; }
  bool isMoeLayer(int64_t i) const { return moeNumExperts > 0 && (moeEvery == 1 || i % moeEvery == 1); }
  // Every parameter by name and shape in first-use order; with tensor > 1, a tensor-parallel rank's slices.
  std::vector<std::pair<std::string, Shape>> parameterShapes(int64_t tensor = 1) const;
  int64_t numParameters() const;
  // FLOPs of one training example (seqLength input tokens, decoderSeqLength targets): 6 x (encoder
  // parameters x S_e + decoder parameters x S_d + the LM head x S_d; a Switch layer counts the top-k experts
  // a token runs through and the router) + 12 x inner x (L_e S_e^2 + L_d S_d^2
  // + L_d S_d S_e) for the scores and their use (self-attention in both stacks, cross-attention).
  double flopsPerSequence() const;
  // flopsPerSequence() / seqLength: per encoder input token, the count a trainer that reports B x S_e tokens
  // per step needs.
  double flopsPerToken() const;
};

class T5 : public nn::Module {
 public:
  explicit T5(const T5Config& config);

  // Encoder output [B, S_e, C].
  Tensor encode(const Tensor& inputIds, const Tensor& attentionMask, DType compute);
  // LM logits [B, S_d, vocab] for decoderInputIds (labels shifted right: t5ShiftRight).
  Tensor logits(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
                DType compute);
  // Mean cross-entropy of the decoder's predictions against labels [B, S_d] (fp32 scalar), plus in training
  // the Switch layers' weighted auxiliary losses (load balance, z-loss). decoderInputIds undefined means
  // t5ShiftRight(labels).
  Tensor loss(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
              const Tensor& labels, DType compute);

  int64_t vocabSize() const { return config_.vocabSize; }
  double flopsPerToken() const { return config_.flopsPerToken(); }
  const T5Config& config() const { return config_; }

 protected:
  // forward({inputIds, attentionMask, decoderInputIds[, labels]}) -> {logits} or {loss}.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  Tensor padding(const Tensor& attentionMask) const;
  // The decoder's final states, scaled by d_model^-0.5 when config.scaleDecoderOutputs.
  Tensor decoderHidden(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
                       DType compute);
  nn::Embedding& head();
  Tensor headLoss(const Tensor& hidden, const Tensor& labels);

  T5Config config_;
  std::vector<nn::MoE*> moes_;  // Switch layers' experts, both stacks
  std::shared_ptr<nn::Embedding> shared_, lmHead_;
  std::shared_ptr<T5Stack> encoder_, decoder_;
};

// HF's _shift_right: [decoderStartId, labels[:, :-1]] with -100 replaced by padId. i64 [B, S] on labels'
// device (computed on the host: ids are small).
Tensor t5ShiftRight(const Tensor& labels, int64_t decoderStartId = 0, int64_t padId = 0);

}  // namespace strata::models
