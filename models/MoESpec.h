// The mixture-of-experts keys every zoo architecture with experts carries (model.moe_*: GPT-MoE, and T5 as
// Switch Transformers), copied between their configs, and the nn::MoE layer they describe.
#pragma once

#include "strata/nn/MoE.h"

namespace strata::models {

// Copies the moe* fields (and the expert-parallel group) from one config to another.
template <class To, class From>
void copyMoeFields(To& to, const From& from) {
  to.moeNumExperts = from.moeNumExperts;
  to.moeTopK = from.moeTopK;
  to.moeEvery = from.moeEvery;
  to.moeCapacityFactor = from.moeCapacityFactor;
  to.moeEvalCapacityFactor = from.moeEvalCapacityFactor;
  to.moeAuxLossCoef = from.moeAuxLossCoef;
  to.moeZLossCoef = from.moeZLossCoef;
  to.expertParallel = from.expertParallel;
}

// The MoE layer of a config with those fields: experts of `base`'s shape, activation and initialisation.
template <class Config>
nn::MoEConfig moeLayerConfig(const Config& c, const nn::MlpConfig& base) {
  nn::MoEConfig m;
  m.hiddenSize = base.hiddenSize;
  m.ffnHiddenSize = base.ffnHiddenSize;
  m.numExperts = c.moeNumExperts;
  m.topK = c.moeTopK;
  m.capacityFactor = c.moeCapacityFactor;
  m.evalCapacityFactor = c.moeEvalCapacityFactor;
  m.auxLossCoef = c.moeAuxLossCoef;
  m.zLossCoef = c.moeZLossCoef;
  m.bias = base.bias;
  m.initStd = base.initStd;
  m.outInitStd = base.outInitStd;
  m.device = base.device;
  m.activation = base.activation;
  m.expertParallel = c.expertParallel;
  m.tensorParallel = base.tensorParallel;  // NOTE [Experts under tensor parallelism] in nn/MoE.h
  return m;
}

}  // namespace strata::models
