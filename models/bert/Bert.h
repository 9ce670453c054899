// BERT: word + position + token-type embeddings and their LayerNorm, post-LN encoder layers with padding
// masks, the masked-LM head tied to the word embeddings, and optionally the pooler and next-sentence head.
// Parameter names: "embeddings.{word,position,token_type,ln}", "layer.<i>.{attn,ln_1,mlp,ln_2}", "cls.*"
// (the MLM head), "pooler", "nsp"; models/bert/BertHf.h maps them onto HF's bert.* / cls.* names.
//
// Masks follow HF: attentionMask [B, S] is 1 for a real token and 0 for padding (undefined: no padding);
// tokenTypes [B, S] undefined means all segment 0; labels are -100 where no loss is taken.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/bert/BertLayer.h"
#include "models/bert/BertMlmHead.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/ModuleList.h"

namespace strata::models {

struct BertConfig {
  int64_t numLayers = 12;
  int64_t hiddenSize = 768;
  int64_t numHeads = 12;
  int64_t ffnHiddenSize = 0;  // 0 means 4 * hiddenSize
  int64_t seqLength = 512;    // the training sequence (its FLOPs, the objective's windows)
  // Rows of the position table (HF's max_position_embeddings); 0 means seqLength.
  int64_t maxPositionEmbeddings = 0;
  int64_t vocabSize = 30522;
  // [PAD]: lookups of it add nothing to the word embeddings' gradient (HF's padding_idx, pad_token_id); -1
  // means vocabSize - 4, the byte layout's [PAD] (data/MaskedLmObjective.h).
  int64_t padTokenId = -1;
  int64_t typeVocabSize = 2;
  double dropout = 0.1;  // hidden and attention-probability dropout
  double layerNormEps = 1e-12;
  double initStd = 0.02;
  nn::Activation activation = nn::Activation::GeluErf;
  bool nspHead = false;  // pooler + next-sentence classifier (BertForPreTraining); off: BertForMaskedLM
  // With a 16-bit compute dtype: the residual stream between the layers in fp32 (BertLayer.h).
  bool fp32Residual = false;
  uint64_t seed = 1234;
  Device device = Device::cpu();
  // Megatron's tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): heads, MLP width and
  // the vocabulary (the word embeddings, the tied MLM decoder and its bias) split over the group; the
  // position and token-type tables, the norms, the MLM transform and the pooler / NSP head whole. No
  // sequence parallelism.
  nn::TensorParallel tensorParallel;

  int64_t ffn() const { return ffnHiddenSize > 0 ? ffnHiddenSize : 4 * hiddenSize; }
  int64_t positions() const { return maxPositionEmbeddings > 0 ? maxPositionEmbeddings : seqLength; }
  int64_t padId() const { return padTokenId >= 0 ? padTokenId : vocabSize - 4; }
  // Every parameter by name and shape in first-use order (the tied decoder counted once), without building;
  // with tensor > 1, a tensor-parallel rank's slices.
  std::vector<std::pair<std::string, Shape>> parameterShapes(int64_t tensor = 1) const;
  int64_t numParameters() const;
  // Training FLOPs per token: 6 x (the parameters a token's forward multiplies by: the layers, the MLM
  // transform and the tied decoder over the whole vocabulary, which the head computes at every position)
  // + 12 L d s for the attention scores and their use. Lookup tables (positions, token types) cost nothing;
  // the pooler and NSP head run once per sequence, so they add 6 (C^2 + 2 C) / s.
  double flopsPerToken() const;
};

class Bert : public nn::Module {
 public:
  explicit Bert(const BertConfig& config);

  // Final hidden states [B, S, C] in `compute`.
  Tensor encode(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute);
  // MLM logits [B, S, vocab].
  Tensor mlmLogits(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute);
  // Mean MLM cross-entropy over the positions whose label is not -100 (fp32 scalar). With `positions` (i64
  // [M]: flat indices b * S + s, as data::mlmMask gives them) the head runs on those tokens only and
  // `labels` holds their labels [M]; otherwise `labels` is [B, S]. The same loss either way (summed in
  // another order).
  Tensor mlmLoss(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                 const Tensor& labels, DType compute, const Tensor& positions = Tensor());
  // Next-sentence logits [B, 2] from the pooled [CLS] state (needs config.nspHead).
  Tensor nspLogits(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute);
  // MLM loss + NSP loss (nspLabels [B]: 0 = B follows A, 1 = random), one forward (needs config.nspHead).
  // `positions` as for mlmLoss.
  Tensor pretrainingLoss(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask,
                         const Tensor& mlmLabels, const Tensor& nspLabels, DType compute,
                         const Tensor& positions = Tensor());

  int64_t contextLength() const { return config_.seqLength; }
  int64_t vocabSize() const { return config_.vocabSize; }
  double flopsPerToken() const { return config_.flopsPerToken(); }
  const BertConfig& config() const { return config_; }

 protected:
  // forward({ids[, tokenTypes, attentionMask[, labels]]}) -> {hidden} without labels, {MLM loss} with them.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  Tensor hidden(const Tensor& ids, const Tensor& tokenTypes, const Tensor& attentionMask, DType compute);
  Tensor nspFromHidden(const Tensor& hidden);

  BertConfig config_;
  std::shared_ptr<nn::Embedding> words_, positions_, tokenTypes_;
  std::shared_ptr<nn::LayerNorm> embeddingLn_;
  std::shared_ptr<nn::ModuleList> layers_;
  std::shared_ptr<BertMlmHead> mlm_;
  std::shared_ptr<nn::Linear> pooler_, nsp_;
};

}  // namespace strata::models
