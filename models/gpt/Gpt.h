// GPT-2 / GPT-3 family: learned positions, pre-LN blocks, a final LayerNorm, and an LM head tied to the token
// embedding. Parameter names follow nanoGPT ("wte.weight", "h.3.attn.qkv.weight", "ln_f.bias"), which map one
// to one onto HF's GPT2LMHeadModel names (see models/gpt/GptHf.h).
#pragma once

#include <memory>

#include "strata/nn/CausalLM.h"
#include "strata/nn/Embedding.h"
#include "strata/nn/MoE.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/Pipeline.h"
#include "strata/nn/TensorParallel.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::models {

struct GptConfig {
  int64_t numLayers = 12;
  int64_t hiddenSize = 768;
  int64_t numHeads = 12;
  int64_t ffnHiddenSize = 0;  // 0 means 4 * hiddenSize
  int64_t seqLength = 1024;
  int64_t maxPositionEmbeddings = 0;  // rows of wpe (HF's n_positions); 0 means seqLength
  int64_t vocabSize = 50257;
  double dropout = 0.0;
  double layerNormEps = 1e-5;
  bool bias = true;
  double initStd = 0.02;
  uint64_t seed = 1234;
  Device device = Device::cpu();
  // Mixture of experts (nn/MoE.h): with moeNumExperts > 0, block i's MLP is moeNumExperts experts when
  // (i + 1) % moeEvery == 0.
  int64_t moeNumExperts = 0, moeTopK = 1, moeEvery = 2;
  double moeCapacityFactor = 1.25, moeEvalCapacityFactor = 2.0, moeAuxLossCoef = 0.01, moeZLossCoef = 0.001;
  nn::ExpertParallel expertParallel;  // NOTE [Expert parallelism] in nn/MoE.h
  // Megatron's tensor parallelism (NOTE [Tensor parallelism] in nn/TensorParallel.h): heads, MLP width (each
  // expert's, NOTE [Experts under tensor parallelism] in nn/MoE.h) and vocabulary split over the group.
  nn::TensorParallel tensorParallel;
  // Pipeline parallelism (NOTE [Pipeline stages] in nn/Pipeline.h): this rank builds only its model chunks'
  // blocks, the embeddings on the first stage, the final norm and the tied head on the last.
  nn::PipelineParallel pipeline;

  int64_t ffn() const { return ffnHiddenSize > 0 ? ffnHiddenSize : 4 * hiddenSize; }
  int64_t positions() const { return maxPositionEmbeddings > 0 ? maxPositionEmbeddings : seqLength; }
  bool isMoeLayer(int64_t i) const { return moeNumExperts > 0 && (i + 1) % moeEvery == 0; }
  // Parameters (tied head counted once; every expert) and training FLOPs per token: 6 N_active + 12 L d s
  // (attention), N_active counting the top-k experts a token runs through (and the router).
  int64_t numParameters() const;
  int64_t activeParameters() const;
  double flopsPerToken() const;
  // Training FLOPs per token of one block, of the embeddings (lookups and their gradients) and of the LM
  // head with its loss: the weights of the pipeline's balanced split.
  double blockFlopsPerToken() const;
  double embeddingFlopsPerToken() const;
  double headFlopsPerToken() const;
  // The blocks of each of the pipeline's P x V model chunks, balanced by those costs.
  std::vector<nn::BlockRange> pipelineSplit() const;
};

class Gpt : public nn::CausalLM, public nn::PipelineStageModel {
 public:
  explicit Gpt(const GptConfig& config);

  int64_t contextLength() const override { return config_.seqLength; }
  int64_t vocabSize() const override { return config_.vocabSize; }
  std::string name() const override { return "gpt"; }
  std::optional<double> flopsPerToken() const override { return config_.flopsPerToken(); }

  const GptConfig& config() const { return config_; }

  // NOTE [Pipeline stages] in nn/Pipeline.h.
  const nn::PipelineParallel& pipeline() const override { return config_.pipeline; }
  Tensor stageForward(int64_t local, const Tensor& input, const Tensor& ids, const Tensor& targets,
                      DType compute) override;
  Shape stageActivationShape(const Shape& ids) const override;
  std::vector<std::string> tiedParameters() const override;
  // The blocks [begin, end) of each model chunk (one chunk, every block, without a pipeline).
  const std::vector<nn::BlockRange>& split() const { return split_; }

 protected:
  // ids [B, T] (i64) -> logits [B, T, vocab] in the compute dtype.
  Tensor logitsImpl(const Tensor& ids, DType compute) override;
  // The tied head and the cross-entropy fused in row chunks (linearCrossEntropy): the [B*T, vocab] logits of
  // the whole batch never exist.
  Tensor lossImpl(const Tensor& ids, const Tensor& targets, DType compute) override;

 private:
  Tensor hidden(const Tensor& ids, DType compute);
  // The embeddings (and their dropout) of ids already padded for sequence parallelism: the residual stream's
  // start.
  Tensor embed(const Tensor& ids, DType compute);
  // The tied head's mean cross-entropy of the final norm's output x against targets (unpadded).
  Tensor headLoss(const Tensor& x, const Tensor& targets);
  // Refuses the whole model's entry points on a pipeline stage.
  void refuseStage(const char* what) const;

  GptConfig config_;
  std::vector<nn::MoE*> moes_;  // the MoE blocks' expert layers
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::LayerNorm> lnF_;
  std::vector<nn::BlockRange> split_;
  // This rank's blocks of each of its model chunks (pipeline), or of the whole model.
  std::vector<std::vector<nn::TransformerBlock*>> chunkBlocks_;
};

}  // namespace strata::models
