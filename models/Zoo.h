// The model zoo: builds a model by architecture name from one spec shared by the architectures.
//
// Architectures and what they are trained on (the trainer's data::Objective for each, NOTE [Training
// objectives] in strata/data/Objective.h):
// - gpt: next-token prediction (nn::CausalLM; data::CausalLmObjective);
// - bert: masked LM, optionally with next-sentence prediction (models::Bert::mlmLoss / pretrainingLoss;
//   data::MaskedLmObjective);
// - t5: span corruption, encoder-decoder (models::T5::loss; data::SpanCorruptionObjective).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/nn/CausalLM.h"
#include "strata/nn/MoE.h"
#include "strata/nn/Pipeline.h"

namespace strata::models {

struct ModelSpec {
  std::string arch = "gpt";
  int64_t numLayers = 4, hiddenSize = 128, numHeads = 4, ffnHiddenSize = 0, seqLength = 128, vocabSize = 256;
  double dropout = 0.0, layerNormEps = 1e-5, initStd = 0.02;
  bool bias = true;
  uint64_t seed = 1234;
  Device device = Device::cpu();
  // Encoder and encoder-decoder architectures (config keys in parentheses; 0 or "default": the arch's own).
  int64_t kvChannels = 0;        // per-head width (model.kv_channels); T5's d_kv, default 64
  int64_t decoderNumLayers = 0;  // T5 decoder layers (model.decoder_num_layers); default num_layers
  int64_t decoderSeqLength = 0;  // T5 target length (model.decoder_seq_length); default seq_length / 4
  int64_t numTokentypes = 2;     // BERT segments (model.num_tokentypes)
  int64_t relativeAttentionNumBuckets = 32, relativeAttentionMaxDistance = 128;  // T5
  // "gelu" (exact), "gelu_tanh", "relu", "gated_gelu" (model.activation); default: gpt gelu_tanh, bert gelu,
  // t5 relu (v1.0; v1.1 is gated_gelu with untied embeddings).
  std::string activation = "default";
  bool untieEmbeddingsAndOutputWeights = false;  // T5 v1.1's own lm_head
  // T5's decoder output scaled by d_model^-0.5 before the head (model.scale_decoder_outputs): "true",
  // "false", or "default": scaled when the head is tied. v1.0 is tied and scaled, v1.1 untied and unscaled as
  // transformers 4.x writes it; transformers 5.x ties every T5 head and writes v1.1 tied and unscaled.
  std::string scaleDecoderOutputs = "default";
  // Rows of the learned position table (gpt, bert; model.max_position_embeddings); 0: seq_length. Training
  // windows (seqLength) may be shorter than the table: HF's bert-base has 512 positions.
  int64_t maxPositionEmbeddings = 0;
  // BERT's [PAD] (model.pad_token_id); -1: vocab_size - 4, the byte layout's (bytes, then [PAD] [CLS] [SEP]
  // [MASK]). Lookups of it add nothing to the word embeddings' gradient (HF's padding_idx).
  int64_t padTokenId = -1;
  bool bertBinaryHead = false;  // BERT's pooler and NSP head
  bool fp32Residual = false;    // BERT's residual stream in fp32 (model.fp32_residual)
  // GPT with mixture-of-experts MLPs (model.moe_*; nn/MoE.h): 0 experts is the dense GPT.
  int64_t moeNumExperts = 0, moeTopK = 1, moeEvery = 2;
  double moeCapacityFactor = 1.25, moeEvalCapacityFactor = 2.0, moeAuxLossCoef = 0.01, moeZLossCoef = 0.001;
  // The MoE layers' expert-parallel group (NOTE [Expert parallelism] in nn/MoE.h); the trainer fills it
  // from model.moe_expert_parallel_size.
  nn::ExpertParallel expertParallel;
  // The tensor-parallel group of every architecture (NOTE [Tensor parallelism] in nn/TensorParallel.h); the
  // trainer fills it from parallel.tensor.
  nn::TensorParallel tensorParallel;
  // gpt: this rank's pipeline stage (NOTE [Pipeline stages] in nn/Pipeline.h); the trainer fills it from
  // parallel.pipeline and parallel.virtual_stages.
  nn::PipelineParallel pipeline;
};

// What an architecture is trained on.
enum class Objective { CausalLM, MaskedLM, SpanCorruption };
Objective objective(const std::string& arch);
// "next token", "masked LM", "span corruption".
std::string objectiveName(Objective objective);

// Any architecture: Gpt (an nn::CausalLM), Bert or T5.
std::shared_ptr<nn::Module> buildModule(const ModelSpec& spec);
// The causal LMs only (an nn::CausalLM); an encoder arch is refused, naming its objective.
std::shared_ptr<nn::CausalLM> buildModel(const ModelSpec& spec);
struct GptConfig;
struct BertConfig;
struct T5Config;
// Each architecture's config for a spec (what buildModule builds).
GptConfig gptConfig(const ModelSpec& spec);
BertConfig bertConfig(const ModelSpec& spec);
T5Config t5Config(const ModelSpec& spec);
std::vector<std::string> architectures();
// model.activation with "default" replaced by the architecture's own (gpt gelu_tanh, bert gelu, t5 relu): two
// specs of one architecture build the same layers when these agree (a checkpoint's "gelu" is bert's default).
std::string activationName(const ModelSpec& spec);
// The model's head in words, for `strata convert --from-hf` and `strata info`: tied or not, T5's scaling, the
// activation, the position table and BERT's [PAD] ("head tied to wte; GELU (tanh); 1024 positions").
std::string describeHead(const ModelSpec& spec);
// Parameters and training FLOPs per token of the model a spec builds, from the architecture's own formula,
// without building it.
int64_t numParameters(const ModelSpec& spec);
double flopsPerToken(const ModelSpec& spec);
// One line of the spec's shape in the architecture's own terms ("4 layers, hidden 256, ...").
std::string describeShape(const ModelSpec& spec);
// How flopsPerToken counts, in a few words ("6N + 12 L d s"), and what a token is for it.
std::string flopsFormula(const ModelSpec& spec);
// Every parameter of the model a spec builds, by name and shape, in first-use order (the order a forward
// touches them; a tied tensor once), without building it: `strata info` plans chunks of models that would not
// fit here. A test checks it against the built model.
std::vector<std::pair<std::string, Shape>> parameterShapes(const ModelSpec& spec);

}  // namespace strata::models
