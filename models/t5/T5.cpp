#include "models/t5/T5.h"

#include <cmath>

#include "models/MoESpec.h"
#include "strata/autograd/Functions.h"
#include "strata/nn/DeferredInit.h"
#include "strata/ops/Ops.h"

namespace strata::models {

T5Config T5Config::v1_0() {
  return T5Config{};
}

T5Config T5Config::v1_1() {
  T5Config c;
  c.numHeads = 6;
  c.ffnHiddenSize = 1024;
  c.numLayers = 8;
  c.gatedGelu = true;
  c.tieWordEmbeddings = false;
  c.scaleDecoderOutputs = false;
  c.dropout = 0.0;  // v1.1 pre-trains without dropout
  return c;
}

std::vector<std::pair<std::string, Shape>> T5Config::parameterShapes(int64_t T) const {
  // A tensor-parallel rank's slices: heads, widths and the vocabulary over T.
  int64_t C = hiddenSize, I = innerSize() / T, F = ffnHiddenSize / T;
  std::vector<std::pair<std::string, Shape>> out{{"shared.weight", {vocabSize / T, C}}};
  auto stack = [&](const std::string& name, int64_t layers, bool decoder) {
    out.emplace_back(name + ".relative_bias.weight", Shape{relativeAttentionNumBuckets, numHeads / T});
    for (int64_t i = 0; i < layers; ++i) {
      std::string b = name + ".block." + std::to_string(i) + ".";
      out.emplace_back(b + "attn_norm.weight", Shape{C});
      out.emplace_back(b + "attn.qkv.weight", Shape{C, 3 * I});
      out.emplace_back(b + "attn.proj.weight", Shape{I, C});
      if (decoder) {
        out.emplace_back(b + "cross_norm.weight", Shape{C});
        out.emplace_back(b + "cross.q.weight", Shape{C, I});
        out.emplace_back(b + "cross.kv.weight", Shape{C, 2 * I});
        out.emplace_back(b + "cross.proj.weight", Shape{I, C});
      }
      out.emplace_back(b + "ff_norm.weight", Shape{C});
      if (isMoeLayer(i)) {
        // The router, then every expert in order (NOTE [MoE dispatch]: each is called every forward).
        out.emplace_back(b + "ff.router.weight", Shape{C, moeNumExperts});
        for (int64_t e = 0; e < moeNumExperts; ++e) {
          std::string x = b + "ff.experts." + std::to_string(e) + ".";
          out.emplace_back(x + "fc.weight", Shape{C, F});
          out.emplace_back(x + "proj.weight", Shape{F, C});
        }
        continue;
      }
      if (gatedGelu) {
        out.emplace_back(b + "ff.gate.weight", Shape{C, F});
        out.emplace_back(b + "ff.up.weight", Shape{C, F});
      } else {
        out.emplace_back(b + "ff.fc.weight", Shape{C, F});
      }
      out.emplace_back(b + "ff.proj.weight", Shape{F, C});
    }
    out.emplace_back(name + ".final_norm.weight", Shape{C});
  };
  stack("encoder", numLayers, false);
  stack("decoder", decoderLayers(), true);
  if (!tieWordEmbeddings) out.emplace_back("lm_head.weight", Shape{vocabSize / T, C});
  return out;
}

int64_t T5Config::numParameters() const {
  int64_t n = 0;
  for (auto& [name, shape] : parameterShapes()) n += numelOf(shape);
  return n;
}

double T5Config::flopsPerSequence() const {
  double C = double(hiddenSize), I = double(innerSize()), F = double(ffnHiddenSize), V = double(vocabSize);
  double Le = double(numLayers), Ld = double(decoderLayers()), Se = double(seqLength),
         Sd = double(decoderSeqLength);
  double dense = (gatedGelu ? 3.0 : 2.0) * C * F;
  double sparse = double(moeTopK) * 2.0 * C * F + C * double(moeNumExperts);  // k experts and the router
  auto ff = [&](int64_t layers) {
    double sum = 0;
    for (int64_t i = 0; i < layers; ++i) sum += isMoeLayer(i) ? sparse : dense;
    return sum;
  };
  double matmuls =
      (Le * 4 * C * I + ff(numLayers)) * Se + (Ld * 8 * C * I + ff(decoderLayers())) * Sd + V * C * Sd;
  double attention = I * (Le * Se * Se + Ld * Sd * Sd + Ld * Sd * Se);
  return 6.0 * matmuls + 12.0 * attention;
}

double T5Config::flopsPerToken() const {
  return flopsPerSequence() / double(seqLength);
}

T5::T5(const T5Config& config) : config_(config) {
  STRATA_USER_CHECK(config.numHeads > 0 && config.headDim > 0,
                    "t5: model.num_attention_heads ({}) and model.kv_channels ({}) must be positive",
                    config.numHeads, config.headDim);
  const nn::TensorParallel& tp = config.tensorParallel;
  nn::checkTensorSplit(tp, "t5", config.numHeads, config.ffnHiddenSize, "model.ffn_hidden_size",
                       config.vocabSize, false);
  Generator gen(config.seed);
  int64_t C = config.hiddenSize, I = config.innerSize(), F = config.ffnHiddenSize;
  double f = config.initFactor;
  // HF's T5 initialisation: every std is a fan-in rule, so the unscaled attention starts well conditioned.
  double embedStd = f * 1.0, modelStd = f / std::sqrt(double(C)),
         qStd = f / std::sqrt(double(C * config.headDim));
  double outStd = f / std::sqrt(double(I)), ffOutStd = f / std::sqrt(double(F));
  auto table = [&](double std) {
    nn::EmbeddingConfig e{config.vocabSize, C, std, config.device};
    e.tensorParallel = tp;
    return std::make_shared<nn::Embedding>(e, gen);
  };
  shared_ = registerModule("shared", table(embedStd));
  auto stack = [&](bool decoder) {
    T5StackConfig s;
    s.numLayers = decoder ? config.decoderLayers() : config.numLayers;
    s.dropout = config.dropout;
    nn::AttentionConfig a{C,        config.numHeads, decoder,      false, false, config.dropout,
                          modelStd, outStd,          config.device};
    a.headDim = config.headDim;
    a.scale = 1.0;
    a.tensorParallel = tp;
    s.block.selfAttention = a;
    a.causal = false;
    a.cross = true;
    s.block.crossAttention = a;
    s.block.ff = nn::MlpConfig{C,
                               F,
                               false,
                               config.dropout,
                               modelStd,
                               ffOutStd,
                               config.device,
                               config.gatedGelu ? nn::Activation::GeluTanh : nn::Activation::Relu,
                               config.gatedGelu};
    s.block.ff.tensorParallel = tp;
    if (config.moeNumExperts > 0) {
      s.block.moe = moeLayerConfig(config, s.block.ff);  // ReLU experts of the feed-forward's shape
      for (int64_t i = 0; i < s.numLayers; ++i) s.sparse.push_back(config.isMoeLayer(i));
    }
    s.block.decoder = decoder;
    s.block.layerNormEps = config.layerNormEps;
    s.relativeBias = nn::RelativePositionBiasConfig{config.numHeads,
                                                    config.relativeAttentionNumBuckets,
                                                    config.relativeAttentionMaxDistance,
                                                    !decoder,
                                                    modelStd,
                                                    config.device};
    s.relativeBias.tensorParallel = tp;
    return std::make_shared<T5Stack>(s, gen);
  };
  encoder_ = registerModule("encoder", stack(false));
  decoder_ = registerModule("decoder", stack(true));
  for (auto& [name, module] : namedModules())
    if (auto* moe = dynamic_cast<nn::MoE*>(module)) moes_.push_back(moe);
  // An untied head starts at d_model^-0.5 (Mesh TensorFlow's unembedding), not at HF's std 1: with std 1 the
  // first logits have a standard deviation of sqrt(d_model) and the first losses are several times ln(vocab).
  if (!config.tieWordEmbeddings) lmHead_ = registerModule("lm_head", table(modelStd));
  // The q projections start smaller than k and v (HF: d_model * d_kv fan-in): they stand in for the 1/sqrt(d)
  // the attention does not apply. q is the first I columns of a packed qkv and the whole of a cross q (split
  // by heads: the first I / T columns here, this rank's columns of the one-rank draws).
  for (auto& [name, p] : namedParameters()) {
    bool packed = name.ends_with("attn.qkv.weight"), crossQ = name.ends_with("cross.q.weight");
    if (!packed && !crossQ) continue;
    GeneratorState draws{gen.seed(), gen.reserve(uint64_t(C * I))};
    nn::editInitialValue(p, [C, I, qStd, tp, draws, device = config.device](const Tensor& value) {
      Generator replay(draws);
      Tensor drawn = ops::randn({C, I}, replay, DType::F32, device, 0, qStd);
      ops::copy(value.narrow(1, 0, I / tp.size),
                tp.active() ? nn::columnSlice(drawn, 1, tp.size, tp.rank) : drawn);
    });
  }
}

Tensor T5::padding(const Tensor& attentionMask) const {
  if (!attentionMask.defined()) return Tensor();
  return ops::eq(attentionMask.to(DType::F32), ops::zeros({}, DType::F32, attentionMask.device()));
}

Tensor T5::encode(const Tensor& inputIds, const Tensor& attentionMask, DType compute) {
  return call({inputIds, attentionMask}, [&](const std::vector<Tensor>& in) {
    STRATA_CHECK(in[0].dim() == 2, "t5: input ids must be [batch, seq], got {}", toString(in[0].shape()));
    return std::vector<Tensor>{encoder_->apply(shared_->apply(in[0], compute), padding(in[1]))};
  })[0];
}

Tensor T5::decoderHidden(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
                         DType compute) {
  STRATA_CHECK(
      inputIds.dim() == 2 && decoderInputIds.dim() == 2 && inputIds.size(0) == decoderInputIds.size(0),
      "t5: input ids and decoder input ids must be [batch, seq] with one batch, got {} and {}",
      toString(inputIds.shape()), toString(decoderInputIds.shape()));
  Tensor pad = padding(attentionMask);
  Tensor memory = encoder_->apply(shared_->apply(inputIds, compute), pad);
  Tensor h = decoder_->apply(shared_->apply(decoderInputIds, compute), Tensor(), memory, pad);
  return config_.scaleDecoderOutputs ? h * std::pow(double(config_.hiddenSize), -0.5) : h;
}

nn::Embedding& T5::head() {
  return config_.tieWordEmbeddings ? *shared_ : *lmHead_;
}

Tensor T5::headLoss(const Tensor& hidden, const Tensor& labels) {
  STRATA_CHECK(labels.numel() * config_.hiddenSize == hidden.numel(),
               "t5: labels {} must be shaped like the decoder ids {}", toString(labels.shape()),
               toString(hidden.shape()));
  // The head and the cross-entropy fused in row chunks: the [B * S_d, vocab] logits never exist at once.
  return head().unembedCrossEntropy(hidden.reshape({-1, config_.hiddenSize}), labels.reshape({-1}));
}

Tensor T5::logits(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
                  DType compute) {
  return call({inputIds, attentionMask, decoderInputIds}, [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{head().unembed(decoderHidden(in[0], in[1], in[2], compute), compute)};
  })[0];
}

Tensor T5::loss(const Tensor& inputIds, const Tensor& attentionMask, const Tensor& decoderInputIds,
                const Tensor& labels, DType compute) {
  Tensor decoderIds = decoderInputIds.defined() ? decoderInputIds : t5ShiftRight(labels);
  return call({inputIds, attentionMask, decoderIds, labels}, [&](const std::vector<Tensor>& in) {
    Tensor loss = headLoss(decoderHidden(in[0], in[1], in[2], compute), in[3]);
    // Training adds the Switch layers' weighted auxiliary losses; evaluation reports the cross-entropy.
    if (isTraining())
      for (nn::MoE* moe : moes_) loss = loss + moe->auxLoss().to(loss.dtype());
    return std::vector<Tensor>{loss};
  })[0];
}

std::vector<Tensor> T5::forwardImpl(const std::vector<Tensor>& inputs) {
  DType compute = shared_->weight.dtype();
  Tensor h = decoderHidden(inputs.at(0), inputs.at(1), inputs.at(2), compute);
  if (inputs.size() > 3 && inputs[3].defined()) return {headLoss(h, inputs[3])};
  return {head().unembed(h, compute)};
}

Tensor t5ShiftRight(const Tensor& labels, int64_t decoderStartId, int64_t padId) {
  STRATA_CHECK(labels.dim() == 2, "t5ShiftRight: labels must be [batch, seq], got {}",
               toString(labels.shape()));
  int64_t B = labels.size(0), S = labels.size(1);
  std::vector<int64_t> l = labels.to(Device::cpu(), DType::I64).contiguous().toVector<int64_t>();
  std::vector<int64_t> out(l.size());
  for (int64_t b = 0; b < B; ++b) {
    out[size_t(b * S)] = decoderStartId;
    for (int64_t s = 1; s < S; ++s) {
      int64_t v = l[size_t(b * S + s - 1)];
      out[size_t(b * S + s)] = v == -100 ? padId : v;
    }
  }
  return Tensor::fromVector<int64_t>(out, {B, S}, labels.device());
}

}  // namespace strata::models
