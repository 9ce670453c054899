#include "models/Zoo.h"

#include <algorithm>

#include "strata/core/Error.h"

#include "models/MoESpec.h"
#include "models/bert/Bert.h"
#include "models/gpt/Gpt.h"
#include "models/t5/T5.h"

namespace strata::models {
namespace {

[[noreturn]] void unknownArch(const std::string& arch) {
  STRATA_USER_FAIL("unknown model.arch '{}' (available: gpt, bert, t5)", arch);
}

nn::Activation activationOf(const ModelSpec& s, nn::Activation fallback) {
  if (s.activation == "default") return fallback;
  if (s.activation == "gelu") return nn::Activation::GeluErf;
  if (s.activation == "gelu_tanh") return nn::Activation::GeluTanh;
  if (s.activation == "relu") return nn::Activation::Relu;
  STRATA_USER_FAIL("model.activation '{}' does not apply to model.arch '{}'", s.activation, s.arch);
}

// The keys of one architecture left at their defaults by the others.
void checkOtherArchKeys(const ModelSpec& s) {
  STRATA_USER_CHECK(s.arch == "t5" || s.scaleDecoderOutputs == "default",
                    "model.scale_decoder_outputs is t5's; leave it at default for model.arch '{}'", s.arch);
  STRATA_USER_CHECK(s.arch != "t5" || s.maxPositionEmbeddings == 0,
                    "t5 has relative positions and no position table: leave model.max_position_embeddings "
                    "at 0");
  STRATA_USER_CHECK(s.arch == "bert" || s.padTokenId == -1,
                    "model.pad_token_id is bert's [PAD] (gpt feeds no padding; t5's [PAD] is its "
                    "tokenizer's): leave it at -1 for model.arch '{}'",
                    s.arch);
}

// ", 512 positions" when the position table is longer than the training sequence.
template <class Config>
std::string positionsNote(const Config& c) {
  return c.positions() != c.seqLength ? detail::format(" ({} positions)", c.positions()) : std::string();
}

}  // namespace

std::string activationName(const ModelSpec& spec) {
  if (spec.activation != "default") return spec.activation;
  switch (objective(spec.arch)) {
    case Objective::CausalLM:
      return "gelu_tanh";
    case Objective::MaskedLM:
      return "gelu";
    case Objective::SpanCorruption:
      return "relu";
  }
  return spec.activation;
}

Objective objective(const std::string& arch) {
  if (arch == "gpt") return Objective::CausalLM;
  if (arch == "bert") return Objective::MaskedLM;
  if (arch == "t5") return Objective::SpanCorruption;
  unknownArch(arch);
}

std::string objectiveName(Objective o) {
  switch (o) {
    case Objective::CausalLM:
      return "next token";
    case Objective::MaskedLM:
      return "masked LM";
    case Objective::SpanCorruption:
      return "span corruption";
  }
  return "?";
}

GptConfig gptConfig(const ModelSpec& s) {
  STRATA_USER_CHECK(!s.fp32Residual,
                    "model.fp32_residual is for bert; gpt keeps its residual stream in the "
                    "compute dtype");
  STRATA_USER_CHECK(s.activation == "default" || s.activation == "gelu_tanh",
                    "model.activation '{}': gpt uses gelu_tanh", s.activation);
  STRATA_USER_CHECK(s.kvChannels == 0,
                    "gpt's heads are hidden_size / num_attention_heads wide: leave "
                    "model.kv_channels at 0");
  checkOtherArchKeys(s);
  GptConfig c;
  c.numLayers = s.numLayers;
  c.hiddenSize = s.hiddenSize;
  c.numHeads = s.numHeads;
  c.ffnHiddenSize = s.ffnHiddenSize;
  c.seqLength = s.seqLength;
  c.maxPositionEmbeddings = s.maxPositionEmbeddings;
  c.vocabSize = s.vocabSize;
  c.dropout = s.dropout;
  c.layerNormEps = s.layerNormEps;
  c.bias = s.bias;
  c.initStd = s.initStd;
  c.seed = s.seed;
  c.device = s.device;
  copyMoeFields(c, s);
  STRATA_USER_CHECK(c.moeNumExperts == 0 || c.moeTopK <= c.moeNumExperts,
                    "model.moe_top_k ({}) exceeds model.moe_num_experts ({})", c.moeTopK, c.moeNumExperts);
  c.tensorParallel = s.tensorParallel;
  c.pipeline = s.pipeline;
  return c;
}

BertConfig bertConfig(const ModelSpec& s) {
  STRATA_USER_CHECK(s.bias, "bert always has biases (model.bias = false is not supported)");
  STRATA_USER_CHECK(s.moeNumExperts == 0,
                    "bert has no mixture-of-experts form: model.moe_num_experts is for gpt and t5 (Switch "
                    "Transformers)");
  STRATA_USER_CHECK(s.kvChannels == 0,
                    "bert's heads are hidden_size / num_attention_heads wide: leave "
                    "model.kv_channels at 0");
  checkOtherArchKeys(s);
  BertConfig c;
  c.numLayers = s.numLayers;
  c.hiddenSize = s.hiddenSize;
  c.numHeads = s.numHeads;
  c.ffnHiddenSize = s.ffnHiddenSize;
  c.seqLength = s.seqLength;
  c.maxPositionEmbeddings = s.maxPositionEmbeddings;
  c.vocabSize = s.vocabSize;
  c.padTokenId = s.padTokenId;
  c.typeVocabSize = s.numTokentypes;
  c.dropout = s.dropout;
  c.layerNormEps = s.layerNormEps;
  c.initStd = s.initStd;
  c.activation = activationOf(s, nn::Activation::GeluErf);
  c.nspHead = s.bertBinaryHead;
  c.fp32Residual = s.fp32Residual;
  c.seed = s.seed;
  c.device = s.device;
  c.tensorParallel = s.tensorParallel;
  return c;
}

T5Config t5Config(const ModelSpec& s) {
  STRATA_USER_CHECK(!s.fp32Residual,
                    "model.fp32_residual is for bert; t5 keeps its residual stream in the "
                    "compute dtype");
  checkOtherArchKeys(s);
  T5Config c;
  c.numLayers = s.numLayers;
  c.numDecoderLayers = s.decoderNumLayers;
  c.hiddenSize = s.hiddenSize;
  c.numHeads = s.numHeads;
  c.headDim = s.kvChannels > 0 ? s.kvChannels : 64;
  c.ffnHiddenSize = s.ffnHiddenSize > 0 ? s.ffnHiddenSize : 4 * s.hiddenSize;
  c.vocabSize = s.vocabSize;
  c.relativeAttentionNumBuckets = s.relativeAttentionNumBuckets;
  c.relativeAttentionMaxDistance = s.relativeAttentionMaxDistance;
  c.seqLength = s.seqLength;
  c.decoderSeqLength = s.decoderSeqLength > 0 ? s.decoderSeqLength : std::max<int64_t>(1, s.seqLength / 4);
  c.dropout = s.dropout;
  c.layerNormEps = s.layerNormEps;
  c.gatedGelu = s.activation == "gated_gelu";
  STRATA_USER_CHECK(c.gatedGelu || s.activation == "default" || s.activation == "relu",
                    "model.activation '{}': t5 uses relu (v1.0) or gated_gelu (v1.1)", s.activation);
  c.tieWordEmbeddings = !s.untieEmbeddingsAndOutputWeights;
  c.scaleDecoderOutputs =
      s.scaleDecoderOutputs == "default" ? c.tieWordEmbeddings : s.scaleDecoderOutputs == "true";
  STRATA_USER_CHECK(s.scaleDecoderOutputs == "default" || s.scaleDecoderOutputs == "true" ||
                        s.scaleDecoderOutputs == "false",
                    "model.scale_decoder_outputs is default, true or false, got '{}'", s.scaleDecoderOutputs);
  STRATA_USER_CHECK(!s.bias, "t5 has no biases: set model.bias = false");
  copyMoeFields(c, s);
  STRATA_USER_CHECK(c.moeNumExperts == 0 || !c.gatedGelu,
                    "t5 with mixture-of-experts layers (Switch Transformers) has ReLU experts: set "
                    "model.activation to relu");
  STRATA_USER_CHECK(c.moeNumExperts == 0 || c.moeTopK <= c.moeNumExperts,
                    "model.moe_top_k ({}) exceeds model.moe_num_experts ({})", c.moeTopK, c.moeNumExperts);
  c.seed = s.seed;
  c.device = s.device;
  c.tensorParallel = s.tensorParallel;
  return c;
}

std::shared_ptr<nn::Module> buildModule(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM:
      return std::make_shared<Gpt>(gptConfig(s));
    case Objective::MaskedLM:
      return std::make_shared<Bert>(bertConfig(s));
    case Objective::SpanCorruption:
      return std::make_shared<T5>(t5Config(s));
  }
  unknownArch(s.arch);
}

std::shared_ptr<nn::CausalLM> buildModel(const ModelSpec& s) {
  STRATA_USER_CHECK(objective(s.arch) == Objective::CausalLM,
                    "model.arch '{}' is not a causal LM ({} objective): build it with models::buildModule",
                    s.arch, s.arch == "bert" ? "masked-LM" : "span-corruption");
  return std::make_shared<Gpt>(gptConfig(s));
}

std::vector<std::pair<std::string, Shape>> parameterShapes(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::MaskedLM:
      return bertConfig(s).parameterShapes(std::max(1, s.tensorParallel.size));
    case Objective::SpanCorruption:
      return t5Config(s).parameterShapes(std::max(1, s.tensorParallel.size));
    case Objective::CausalLM:
      break;
  }
  GptConfig g = gptConfig(s);
  // A tensor-parallel rank's slices (NOTE [Tensor parallelism] in nn/TensorParallel.h): the token table's
  // rows, q/k/v's and fc's columns, the projections' rows, over T.
  int64_t C = g.hiddenSize, F = g.ffn(), T = std::max(1, s.tensorParallel.size);
  std::vector<std::pair<std::string, Shape>> out{{"wte.weight", {g.vocabSize / T, C}},
                                                 {"wpe.weight", {g.positions(), C}}};
  auto linear = [&](const std::string& name, int64_t in, int64_t n) {
    out.emplace_back(name + ".weight", Shape{in, n});
    if (g.bias) out.emplace_back(name + ".bias", Shape{n});
  };
  auto norm = [&](const std::string& name) {
    out.emplace_back(name + ".weight", Shape{C});
    out.emplace_back(name + ".bias", Shape{C});
  };
  for (int64_t i = 0; i < g.numLayers; ++i) {
    std::string h = "h." + std::to_string(i) + ".";
    norm(h + "ln_1");
    linear(h + "attn.qkv", C, 3 * C / T);
    linear(h + "attn.proj", C / T, C);
    norm(h + "ln_2");
    if (g.isMoeLayer(i)) {
      // The router, then every expert in order (NOTE [MoE dispatch]: each is called every forward).
      out.emplace_back(h + "mlp.router.weight", Shape{C, g.moeNumExperts});
      for (int64_t e = 0; e < g.moeNumExperts; ++e) {
        std::string x = h + "mlp.experts." + std::to_string(e) + ".";
        linear(x + "fc", C, F / T);
        linear(x + "proj", F / T, C);
      }
      continue;
    }
    linear(h + "mlp.fc", C, F / T);
    linear(h + "mlp.proj", F / T, C);
  }
  norm("ln_f");
  return out;
}

std::vector<std::string> architectures() {
  return {"gpt", "bert", "t5"};
}

int64_t numParameters(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM:
      return gptConfig(s).numParameters();
    case Objective::MaskedLM:
      return bertConfig(s).numParameters();
    case Objective::SpanCorruption:
      return t5Config(s).numParameters();
  }
  unknownArch(s.arch);
}

double flopsPerToken(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM:
      return gptConfig(s).flopsPerToken();
    case Objective::MaskedLM:
      return bertConfig(s).flopsPerToken();
    case Objective::SpanCorruption:
      return t5Config(s).flopsPerToken();
  }
  unknownArch(s.arch);
}

std::string describeShape(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM: {
      GptConfig g = gptConfig(s);
      return detail::format("{} layers, hidden {}, {} heads, ffn {}, seq {}{}, vocab {}", g.numLayers,
                            g.hiddenSize, g.numHeads, g.ffn(), g.seqLength, positionsNote(g), g.vocabSize);
    }
    case Objective::MaskedLM: {
      BertConfig b = bertConfig(s);
      return detail::format("{} layers, hidden {}, {} heads, ffn {}, seq {}{}, vocab {}{}", b.numLayers,
                            b.hiddenSize, b.numHeads, b.ffn(), b.seqLength, positionsNote(b), b.vocabSize,
                            b.nspHead ? ", NSP head" : "");
    }
    case Objective::SpanCorruption: {
      T5Config t = t5Config(s);
      return detail::format(
          "{} + {} layers, hidden {}, {} heads of {}, ffn {} ({}), seq {} -> {}, vocab {}{}{}", t.numLayers,
          t.decoderLayers(), t.hiddenSize, t.numHeads, t.headDim, t.ffnHiddenSize,
          t.gatedGelu ? "gated GELU" : "ReLU", t.seqLength, t.decoderSeqLength, t.vocabSize,
          t.tieWordEmbeddings == t.scaleDecoderOutputs
              ? (t.tieWordEmbeddings ? "" : ", untied head")
              : (t.tieWordEmbeddings ? ", tied unscaled head" : ", untied scaled head"),
          t.moeNumExperts > 0 ? detail::format(", Switch: {} experts top-{} every {} layers", t.moeNumExperts,
                                               t.moeTopK, t.moeEvery)
                              : std::string());
    }
  }
  unknownArch(s.arch);
}

std::string describeHead(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM: {
      GptConfig g = gptConfig(s);
      return detail::format("head tied to wte; GELU (tanh); {} positions", g.positions());
    }
    case Objective::MaskedLM: {
      BertConfig b = bertConfig(s);
      const char* act = b.activation == nn::Activation::GeluErf    ? "GELU (erf)"
                        : b.activation == nn::Activation::GeluTanh ? "GELU (tanh)"
                                                                   : "ReLU";
      return detail::format(
          "MLM head tied to the word embeddings{}; {}; {} positions, {} token types; [PAD] {}",
          b.nspHead ? ", pooler and NSP head" : "", act, b.positions(), b.typeVocabSize, b.padId());
    }
    case Objective::SpanCorruption: {
      T5Config t = t5Config(s);
      return detail::format("head {}, decoder output {}; {}; relative positions ({} buckets, distance {})",
                            t.tieWordEmbeddings ? "tied to shared" : "of its own (lm_head)",
                            t.scaleDecoderOutputs ? "scaled by d_model^-0.5" : "unscaled",
                            t.gatedGelu ? "gated GELU (tanh)" : "ReLU", t.relativeAttentionNumBuckets,
                            t.relativeAttentionMaxDistance);
    }
  }
  unknownArch(s.arch);
}

std::string flopsFormula(const ModelSpec& s) {
  switch (objective(s.arch)) {
    case Objective::CausalLM:
      return "6N + 12 L d s";
    case Objective::MaskedLM:
      return "6 x (layers + MLM head over the vocabulary) + 12 L d s";
    case Objective::SpanCorruption:
      return "6 x (encoder S_e + decoder and head S_d) + attention, per input token";
  }
  unknownArch(s.arch);
}

}  // namespace strata::models
