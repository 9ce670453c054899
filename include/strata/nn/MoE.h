// A Mixture-of-Experts MLP (Switch Transformers; GShard's top-2): a router picks, per token, the top-k of
// E expert MLPs; each expert takes at most `capacity` tokens, and a token past its expert's capacity is
// dropped (its output here is zero, so the block's residual carries it through).
//
// NOTE [MoE dispatch]
// - Router: logits = x W_r in fp32 (16-bit inputs and weights are widened first), probabilities by softmax.
// - Choices: each token's top-k experts by probability (ties to the lower index), read on the host. Slots
//   are given in priority order: every token's first choice in token order, then every token's second (so
//   a token's second choice never takes a slot from another's first). An expert's capacity is
//   ceil(capacity_factor x tokens x k / E) (eval_capacity_factor outside training), at least 1.
// - Dispatch: the kept (token, expert) pairs are gathered into one buffer, expert by expert, each expert's
//   rows contiguous (a permutation of rows: no masked dense matmul), and each expert runs once on its rows.
// - Combine: each token's output gathers its expert rows back, weighted by its router probabilities (top-1:
//   the probability itself, as Switch; top-2: the two renormalised to sum to 1, as GShard). A dropped choice
//   gathers a zero row. Gradients reach the router through the weights, and x through the dispatch.
// - Auxiliary losses: Switch's load balancing E x sum_e f_e P_e (f_e the fraction of tokens whose first
//   choice is e, P_e the mean probability of e) and ST-MoE's router z-loss mean((logsumexp logits)^2), each
//   times its coefficient; auxLoss() is their weighted sum for the objective to add to the loss.
#pragma once

#include <vector>

#include "strata/core/Generator.h"
#include "strata/nn/Linear.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::nn {

struct MoEConfig {
  int64_t hiddenSize = 0;
  int64_t ffnHiddenSize = 0;
  int64_t numExperts = 8;
  int64_t topK = 1;  // 1 (Switch) or 2
  double capacityFactor = 1.25;
  double evalCapacityFactor = 2.0;
  double auxLossCoef = 0.01;
  double zLossCoef = 0.001;
  bool bias = true;
  double initStd = 0.02;
  double outInitStd = 0.02;
  Device device = Device::cpu();
  Activation activation = Activation::GeluTanh;
};

// What the last forward routed.
struct MoEStats {
  std::vector<int64_t> tokensPerExpert;  // kept (token, expert) pairs per expert
  int64_t choices = 0;                   // tokens x k
  int64_t dropped = 0;                   // choices past their expert's capacity
  int64_t capacity = 0;
  double auxLoss = 0, zLoss = 0;  // unweighted
  double droppedFraction() const { return choices > 0 ? double(dropped) / double(choices) : 0.0; }
};

class MoE : public Module {
 public:
  MoE(const MoEConfig& config, Generator& gen);
  // x [..., C] -> [..., C].
  Tensor apply(const Tensor& x);
  // The weighted auxiliary losses of the last forward (a scalar in the graph, fp32); undefined before one.
  const Tensor& auxLoss() const { return auxLoss_; }
  const MoEStats& stats() const { return stats_; }
  const MoEConfig& config() const { return config_; }
  Linear& router() { return *router_; }
  Mlp& expert(size_t e) { return dynamic_cast<Mlp&>(experts_->at(e)); }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  MoEConfig config_;
  std::shared_ptr<Linear> router_;
  std::shared_ptr<ModuleList> experts_;
  Tensor auxLoss_;
  MoEStats stats_;
};

}  // namespace strata::nn
