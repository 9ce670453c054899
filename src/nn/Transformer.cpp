// Attention, MLP and the pre-LN Transformer block.
#include <optional>

#include "strata/autograd/Checkpoint.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
#include "strata/nn/MoE.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::nn {

Attention::Attention(const AttentionConfig& config, Generator& gen) : config_(config) {
  STRATA_CHECK(config.numHeads > 0 && (config.headDim > 0 || config.hiddenSize % config.numHeads == 0),
               "attention: hidden size {} is not divisible by {} heads", config.hiddenSize, config.numHeads);
  const TensorParallel& tp = config.tensorParallel;
  STRATA_CHECK(!tp.active() || config.numHeads % tp.size == 0,
               "attention: {} heads do not split over {} tensor-parallel ranks", config.numHeads, tp.size);
  int64_t C = config.hiddenSize, I = config.innerSize();
  // Cross-attention: q column-parallel, the fused k|v column-parallel in 2 groups (this rank's heads' k and
  // v), the encoder output going through f like x.
  auto columns = [&](int64_t out, int64_t groups) {
    return std::make_shared<Linear>(
        LinearConfig{C, out, config.bias, config.initStd, config.device, TensorSplit::Columns, groups, tp},
        gen);
  };
  if (config.cross) {
    q_ = registerModule("q", columns(I, 1));
    kv_ = registerModule("kv", columns(2 * I, 2));
  } else {
    qkv_ = registerModule(
        "qkv", std::make_shared<Linear>(LinearConfig{C, 3 * I, config.bias, config.initStd, config.device,
                                                     TensorSplit::Columns, 3, tp},
                                        gen));
  }
  proj_ = registerModule(
      "proj",
      std::make_shared<Linear>(
          LinearConfig{I, C, config.bias, config.outInitStd, config.device, TensorSplit::Rows, 1, tp}, gen));
}

Tensor Attention::apply(const Tensor& x, const Tensor& memory, const AttentionMask& extra) {
  std::vector<Tensor> inputs{x};
  if (memory.defined() || extra.keyPadding.defined() || extra.bias.defined()) inputs.push_back(memory);
  if (extra.keyPadding.defined() || extra.bias.defined()) {
    inputs.push_back(extra.keyPadding);
    inputs.push_back(extra.bias);
  }
  return forward(inputs)[0];
}

std::vector<Tensor> Attention::forwardImpl(const std::vector<Tensor>& inputs) {
  AttentionMask mask;
  if (inputs.size() > 2) mask.keyPadding = inputs[2];
  if (inputs.size() > 3) mask.bias = inputs[3];
  return {compute(inputs.at(0), inputs.size() > 1 ? inputs[1] : Tensor(), mask)};
}

Tensor Attention::compute(const Tensor& x, const Tensor& memory, const AttentionMask& extra) {
  STRATA_CHECK(x.dim() == 3 && x.size(2) == config_.hiddenSize, "attention: input must be [B, S, {}], got {}",
               config_.hiddenSize, toString(x.shape()));
  // This rank's heads (all of them without tensor parallelism).
  // S: the positions attended over; under sequence parallelism x holds this rank's part of them and the
  // projection gathers the rest (NOTE [Sequence parallelism]), so S is set from it below.
  int64_t B = x.size(0), S = x.size(1), H = config_.localHeads(), D = config_.headWidth();
  int64_t C = H * D;  // the attention's inner width here (the model width unless headDim or tensor
                      // parallelism says otherwise)
  double scale = config_.scale;
  auto heads = [&](const Tensor& t, int64_t len, int64_t parts) {
    // [B, len, parts * C] -> parts tensors [B, H, len, D], each contiguous: one copy here lets every
    // attention GEMM (and k's transposed view) run as a single strided batch without further copies.
    Tensor v = t.view({B, len, parts, H, D}).permute({2, 0, 3, 1, 4}).contiguous();
    std::vector<Tensor> out;
    for (int64_t i = 0; i < parts; ++i) out.push_back(v.select(0, i));
    return out;
  };
  auto composed = [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    AttentionMask mask = extra;
    mask.causal = config_.causal;
    Tensor y = scaledDotProductAttention(q, k, v, mask, config_.dropout, isTraining(), scale);
    return y.permute({0, 2, 1, 3}).reshape({B, S, C});
  };
  // NOTE [Tensor-parallel random streams]: this rank's heads draw their attention dropout from its own
  // stream.
  std::optional<TensorParallelRandom> ownHeads;
  ownHeads.emplace(config_.tensorParallel);
  // The fused kernel reads q, k and v as strided views of the projections and writes [B, S, H, D], already
  // the [B, S, C] layout the output projection takes: no head permutes and no S x S scores. It takes an
  // additive bias (T5's relative positions: NOTE [Biased fused attention] in kernels/FlashAttention.cuh) but
  // no key padding, which goes to the composed path.
  Tensor y;
  if (config_.cross) {
    STRATA_CHECK(memory.defined(), "cross-attention needs the encoder output");
    int64_t Sk = memory.size(1);
    Tensor qp = q_->apply(x), kvp = kv_->apply(memory);
    Tensor q = qp.view({B, S, H, D});
    Tensor kv = kvp.view({B, Sk, 2, H, D});
    Tensor k = kv.select(2, 0), v = kv.select(2, 1);
    if (fusedAttentionTakes(extra, B, H, S, Sk, q.dtype()) &&
        flashAttentionUsable(q, k, v, config_.dropout, isTraining())) {
      y = flashAttention(q, k, v, config_.causal, scale, isTraining() ? config_.dropout : 0.0,
                         defaultGenerator(), extra.bias)
              .reshape({B, S, C});
    } else {
      auto kvHeads = heads(kvp, Sk, 2);
      y = composed(heads(qp, S, 1)[0], kvHeads[0], kvHeads[1]);
    }
  } else {
    Tensor qkv = qkv_->apply(x);
    S = qkv.size(1);
    // A raw view (no autograd node): only its shape, dtype and device are asked about.
    Tensor probe = detail::narrowRaw(detail::viewRaw(qkv, {B, S, 3 * H, D}), 2, 0, H);
    if (fusedAttentionTakes(extra, B, H, S, S, qkv.dtype()) &&
        flashAttentionUsable(probe, probe, probe, config_.dropout, isTraining())) {
      y = flashAttentionPacked(qkv, H, config_.causal, scale, isTraining() ? config_.dropout : 0.0,
                               defaultGenerator(), extra.bias);
    } else {
      auto parts = heads(qkv, S, 3);
      y = composed(parts[0], parts[1], parts[2]);
    }
  }
  ownHeads.reset();
  Tensor out = proj_->apply(y);
  // Whole on every rank (the same mask), or under sequence parallelism this rank's part (its own stream).
  TensorParallelRandom ownPart(config_.tensorParallel, config_.tensorParallel.sequenceParallel);
  return dropout(out, config_.dropout, isTraining());
}

Mlp::Mlp(const MlpConfig& config, Generator& gen) : config_(config) {
  STRATA_CHECK(!config.gated || config.activation == Activation::GeluTanh,
               "mlp: only the tanh GELU is gated (T5 v1.1's gated-gelu)");
  auto linear = [&](int64_t in, int64_t out, double std, TensorSplit split) {
    return std::make_shared<Linear>(
        LinearConfig{in, out, config.bias, std, config.device, split, 1, config.tensorParallel}, gen);
  };
  int64_t C = config.hiddenSize, F = config.ffnHiddenSize;
  if (config.gated) {
    gate_ = registerModule("gate", linear(C, F, config.initStd, TensorSplit::Columns));
    up_ = registerModule("up", linear(C, F, config.initStd, TensorSplit::Columns));
  } else {
    fc_ = registerModule("fc", linear(C, F, config.initStd, TensorSplit::Columns));
  }
  proj_ = registerModule("proj", linear(F, C, config.outInitStd, TensorSplit::Rows));
}

Tensor Mlp::apply(const Tensor& x) {
  return (*this)(x);
}

std::vector<Tensor> Mlp::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& x = inputs.at(0);
  Tensor y;
  bool recompute = recomputeActivation_ && gradEnabled();
  // fc and proj both in FP8, the GELU inside their casts (NOTE [FP8 fused casts]); without tensor
  // parallelism, and not when the GELU and proj are recomputed (that keeps pre alone, where this keeps h's
  // codes too).
  if (!config_.gated && config_.activation == Activation::GeluTanh && fc_->fp8() && proj_->fp8() &&
      !config_.tensorParallel.active() && !recompute) {
    y = fusedCall({fc_.get(), proj_.get()}, {x}, [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{fp8GeluMlp(in[0], fc_->weight, fc_->bias, proj_->weight, proj_->bias,
                                            *fc_->fp8State(), *proj_->fp8State())};
    })[0];
    return {dropout(y, config_.dropout, isTraining())};
  }
  // Other FP8 layers (NOTE [FP8 training]) run fc and proj as layers of their own, the GELU between them.
  if (!config_.gated && config_.activation == Activation::GeluTanh && !fc_->fp8() && !proj_->fp8()) {
    const TensorParallel& tp = config_.tensorParallel;
    // geluMlp reads fc's and proj's parameters itself, so it runs as a call of both (NOTE [Module calls]).
    // Tensor-parallel: f before fc, g after proj's partial product, then proj's whole bias; under sequence
    // parallelism the sequence gathered and reduce-scattered in their place (NOTE [Sequence parallelism]).
    int64_t seqDim = x.dim() - 2;
    Tensor in = tp.splitsSequence() ? gatherSequence(x, tp, seqDim) : copyToTensorParallel(x, tp);
    y = fusedCall({fc_.get(), proj_.get()}, {in}, [&](const std::vector<Tensor>& in) {
      if (!tp.active())
        return std::vector<Tensor>{
            geluMlp(in[0], fc_->weight, fc_->bias, proj_->weight, proj_->bias, /*recomputeGelu=*/recompute)};
      Tensor partial = geluMlp(in[0], fc_->weight, fc_->bias, proj_->weight, Tensor(), recompute);
      Tensor out =
          tp.splitsSequence() ? scatterSequence(partial, tp, seqDim) : reduceFromTensorParallel(partial, tp);
      return std::vector<Tensor>{proj_->bias.defined() ? out + sequenceParallelParameter(proj_->bias, tp)
                                                       : out};
    })[0];
    TensorParallelRandom ownPart(config_.tensorParallel, config_.tensorParallel.sequenceParallel);
    return {dropout(y, config_.dropout, isTraining())};
  }
  // The activation and the projection, from the activation's input(s). A row-parallel projection's
  // collective stays outside the recomputed part: recomputation repeats the product, not the all-reduce.
  auto tail = [this](const std::vector<Tensor>& in) {
    Tensor h = config_.gated                                ? gatedGelu(in[0], in[1])
               : config_.activation == Activation::Relu     ? relu(in[0])
               : config_.activation == Activation::GeluTanh ? gelu(in[0], GeluApprox::Tanh)
                                                            : gelu(in[0], GeluApprox::None);
    return std::vector<Tensor>{proj_->applyPartial(h)};
  };
  std::vector<Tensor> pre;
  if (config_.gated) {
    // Under tensor parallelism one f for gate and up.
    Tensor in = gate_->columnInput(x);
    pre = {gate_->applyToColumnInput(in), up_->applyToColumnInput(in)};
  } else {
    pre = {fc_->apply(x)};
  }
  y = proj_->reducePartial(recompute ? checkpoint(tail, pre)[0] : tail(pre)[0]);
  TensorParallelRandom ownPart(config_.tensorParallel, config_.tensorParallel.sequenceParallel);
  return {dropout(y, config_.dropout, isTraining())};
}

TransformerBlock::TransformerBlock(const TransformerBlockConfig& config, Generator& gen,
                                   std::shared_ptr<Module> feedForward) {
  NormConfig norm{config.attention.hiddenSize, config.layerNormEps, true, config.attention.device,
                  config.attention.tensorParallel};
  ln1_ = registerModule("ln_1", std::make_shared<LayerNorm>(norm));
  attn_ = registerModule("attn", std::make_shared<Attention>(config.attention, gen));
  ln2_ = registerModule("ln_2", std::make_shared<LayerNorm>(norm));
  mlp_ = registerModule("mlp", feedForward ? std::move(feedForward) : std::make_shared<Mlp>(config.mlp, gen));
}

std::array<Tensor, 2> TransformerBlock::compute(const Tensor& x, const Tensor& pending,
                                                const Tensor& keyPadding, const Tensor& bias) {
  AttentionMask mask;
  mask.keyPadding = keyPadding;
  mask.bias = bias;
  Tensor stream = x, normed;
  if (pending.defined()) {
    std::vector<Tensor> norm1 = (*ln1_)(std::vector<Tensor>{x, pending});  // {ln_1(x + pending), x + pending}
    normed = norm1[0];
    stream = norm1[1];
  } else {
    normed = (*ln1_)(x);
  }
  std::vector<Tensor> attnIn{normed};
  if (mask.keyPadding.defined() || mask.bias.defined()) {
    attnIn.push_back(Tensor());
    attnIn.push_back(mask.keyPadding);
    attnIn.push_back(mask.bias);
  }
  // h = stream + attn and ln_2(h) in one pass.
  std::vector<Tensor> norm2 = (*ln2_)(std::vector<Tensor>{stream, (*attn_)(attnIn)[0]});
  return {norm2[1], (*mlp_)(std::vector<Tensor>{norm2[0]})[0]};
}

std::array<Tensor, 2> TransformerBlock::applyStream(const Tensor& x, const Tensor& pending,
                                                    const AttentionMask& mask) {
  std::vector<Tensor> out =
      call({x, pending, mask.keyPadding, mask.bias}, [&](const std::vector<Tensor>& in) {
        auto [next, rest] = compute(in[0], in[1], in[2], in[3]);
        return std::vector<Tensor>{next, rest};
      });
  return {out[0], out[1]};
}

Tensor TransformerBlock::apply(const Tensor& x, const AttentionMask& mask) {
  return call({x, mask.keyPadding, mask.bias}, [&](const std::vector<Tensor>& in) {
    auto [h, m] = compute(in[0], Tensor(), in[1], in[2]);
    return std::vector<Tensor>{h + m};
  })[0];
}

std::vector<Tensor> TransformerBlock::forwardImpl(const std::vector<Tensor>& inputs) {
  if (inputs.size() > 1) {
    auto [next, pending] = compute(inputs[0], inputs[1], Tensor(), Tensor());
    return {next, pending};
  }
  auto [h, m] = compute(inputs.at(0), Tensor(), Tensor(), Tensor());
  return {h + m};
}

Recompute parseRecompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  STRATA_CHECK(name == "full", "recompute: none, selective or full, not '{}'", name);
  return Recompute::Full;
}

void applyRecompute(Module& model, Recompute mode) {
  for (auto& [name, module] : model.namedModules()) {
    if (auto* mlp = dynamic_cast<Mlp*>(module)) mlp->setRecomputeActivation(mode == Recompute::Selective);
    if (dynamic_cast<ModuleList*>(module) == nullptr) continue;
    for (auto& [index, child] : module->children()) {
      // A block with an MoE layer is not recomputed whole: the MoE's auxiliary losses come out of its
      // forward beside the block's outputs, and a checkpointed forward would keep them without a graph.
      bool moe = false;
      for (auto& [sub, m] : child->namedModules()) moe |= dynamic_cast<MoE*>(m) != nullptr;
      child->setRecompute(mode == Recompute::Full && !moe);
    }
  }
}

}  // namespace strata::nn
