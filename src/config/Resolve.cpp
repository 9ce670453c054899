#include "strata/config/Resolve.h"

#include "strata/core/Error.h"

namespace strata::config {

DType computeDTypeFor(const Config& config, Device device) {
  const std::string& dt = config.precision.dtype;
  if (dt == "fp16") return DType::F16;
  if (dt == "bf16" && device.isCuda()) return DType::BF16;
  return DType::F32;
}

Device resolveDevice(const std::string& name) {
  if (name == "auto") return cudaAvailable() ? Device::cuda(0) : Device::cpu();
  Device d = Device::parse(name);
  if (d.isCuda()) {
    STRATA_USER_CHECK(builtWithCuda(), "train.device is '{}' but this build of Strata has no CUDA support",
                      name);
    STRATA_USER_CHECK(d.index < cudaDeviceCount(), "train.device is '{}' but {} CUDA device(s) are visible",
                      name, cudaDeviceCount());
  }
  return d;
}

models::ModelSpec modelSpecFrom(const Config& c, Device device) {
  models::ModelSpec s;
  s.arch = c.model.arch;
  s.numLayers = c.model.numLayers;
  s.hiddenSize = c.model.hiddenSize;
  s.numHeads = c.model.numAttentionHeads;
  s.ffnHiddenSize = c.model.ffnHiddenSize;
  s.seqLength = c.model.seqLength;
  s.vocabSize = c.model.vocabSize;
  s.dropout = c.model.dropout;
  s.layerNormEps = c.model.layerNormEps;
  s.initStd = c.model.initStd;
  s.bias = c.model.bias;
  s.kvChannels = c.model.kvChannels;
  s.decoderNumLayers = c.model.decoderNumLayers;
  s.decoderSeqLength = c.model.decoderSeqLength;
  s.numTokentypes = c.model.numTokentypes;
  s.relativeAttentionNumBuckets = c.model.relativeAttentionNumBuckets;
  s.relativeAttentionMaxDistance = c.model.relativeAttentionMaxDistance;
  s.activation = c.model.activation;
  s.untieEmbeddingsAndOutputWeights = c.model.untieEmbeddingsAndOutputWeights;
  s.bertBinaryHead = c.model.bertBinaryHead;
  s.fp32Residual = c.model.fp32Residual;
  s.moeNumExperts = c.model.moeNumExperts;
  s.moeTopK = c.model.moeTopK;
  s.moeEvery = c.model.moeEvery;
  s.moeCapacityFactor = c.model.moeCapacityFactor;
  s.moeEvalCapacityFactor = c.model.moeEvalCapacityFactor;
  s.moeAuxLossCoef = c.model.moeAuxLossCoef;
  s.moeZLossCoef = c.model.moeZLossCoef;
  s.maxPositionEmbeddings = c.model.maxPositionEmbeddings;
  s.padTokenId = c.model.padTokenId;
  s.scaleDecoderOutputs = c.model.scaleDecoderOutputs;
  s.seed = c.train.seed;
  s.device = device;
  return s;
}

}  // namespace strata::config
