// The pre-LN Transformer block: h = x + attn(ln1(x)), then h + mlp(ln2(h)), with a GELU MLP.
#pragma once

#include "strata/nn/Attention.h"
#include "strata/nn/Norm.h"

namespace strata::nn {

enum class Activation {
  GeluTanh,  // GPT-2's and T5 v1.1's gelu_new
  GeluErf,   // BERT's exact gelu
  Relu,      // T5 v1.0
};

struct MlpConfig {
  int64_t hiddenSize = 0;
  int64_t ffnHiddenSize = 0;
  bool bias = true;
  double dropout = 0.0;
  double initStd = 0.02;
  double outInitStd = 0.02;
  Device device = Device::cpu();
  Activation activation = Activation::GeluTanh;
  // Gated (T5 v1.1): act(x W_gate) * (x W_up), then W_proj; modules "gate", "up", "proj" instead of "fc",
  // "proj". Only GeluTanh is gated.
  bool gated = false;
  // Column-parallel fc (gate and up), row-parallel proj (NOTE [Tensor parallelism] in nn/TensorParallel.h).
  TensorParallel tensorParallel = {};
};

// act(x W_fc + b_fc) W_proj + b_proj, or the gated form above.
class Mlp : public Module {
 public:
  Mlp(const MlpConfig& config, Generator& gen);
  Tensor apply(const Tensor& x);
  // Selective recomputation (train.recompute selective): the activation's output (ffn_hidden_size wide) is
  // not kept for backward. The fused GELU MLP recomputes gelu(pre) from the pre-activation it keeps anyway;
  // the other forms keep the activation's input and run the activation and the projection again.
  void setRecomputeActivation(bool on) { recomputeActivation_ = on; }

 protected:
  // gelu(x W_fc + b_fc) W_proj + b_proj in one fused function, run as a call of fc and proj (their hooks
  // see x and the MLP's output).
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  MlpConfig config_;
  std::shared_ptr<Linear> fc_, gate_, up_, proj_;
  bool recomputeActivation_ = false;
};

struct TransformerBlockConfig {
  AttentionConfig attention;
  MlpConfig mlp;
  double layerNormEps = 1e-5;
};

// forward({x}) -> {block(x)}. forward({x, pending}) -> {x', pending'} runs the block on a residual stream
// held as two tensors whose sum is the stream (pending may be undefined: zero). The adds are left to the
// norms: ln_1 fuses x + pending, ln_2 fuses the attention residual, and the MLP output is handed on as
// pending' for the next block's ln_1 (or the final norm) to fuse. block(x) = x' + pending' for pending = 0.
class TransformerBlock : public Module {
 public:
  // `feedForward` (optional) replaces the MLP built from config.mlp, under the same name "mlp": a module
  // taking and returning one [..., hidden] tensor (nn::MoE).
  TransformerBlock(const TransformerBlockConfig& config, Generator& gen,
                   std::shared_ptr<Module> feedForward = nullptr);
  Tensor apply(const Tensor& x, const AttentionMask& mask = {});
  // {x', pending'} as described above.
  std::array<Tensor, 2> applyStream(const Tensor& x, const Tensor& pending, const AttentionMask& mask = {});

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  std::array<Tensor, 2> compute(const Tensor& x, const Tensor& pending, const Tensor& keyPadding,
                                const Tensor& bias);

  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Module> mlp_;
};

// train.recompute: what a model's backward computes again instead of keeping.
enum class Recompute {
  None,
  Selective,  // the MLP activations (Mlp::setRecomputeActivation); attention keeps no S x S scores anyway
  Full,       // each block: every module held in a ModuleList (GPT's h, BERT's layer, T5's blocks), except
              // blocks with an MoE layer (its auxiliary losses would lose their gradients)
};
Recompute parseRecompute(const std::string& name);  // none, selective, full
// Sets `mode` on the modules of `model` it concerns (Module::setRecompute, Mlp::setRecomputeActivation).
void applyRecompute(Module& model, Recompute mode);

}  // namespace strata::nn
