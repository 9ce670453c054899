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
// - Every expert runs in every forward, in order: one without tokens runs on one zero row whose output no
//   token reads (its gradient is exactly zero). So each expert's hooks, its ZeRO gathers and its gradients'
//   completion come at the same point of every pass, on every rank, whatever the routing: the chunk
//   layout's first-use order, ZeRO-3's gathers and the order in which chunks are reduced across ranks
//   never depend on the data.
// - Combine: each token's output gathers its expert rows back, weighted by its router probabilities (top-1:
//   the probability itself, as Switch; top-2: the two renormalised to sum to 1, as GShard). A dropped choice
//   gathers a zero row. Gradients reach the router through the weights, and x through the dispatch.
// - Auxiliary losses: Switch's load balancing E x sum_e f_e P_e (f_e the fraction of tokens whose first
//   choice is e, P_e the mean probability of e) and ST-MoE's router z-loss mean((logsumexp logits)^2), each
//   times its coefficient; auxLoss() is their weighted sum for the objective to add to the loss.
//
// NOTE [Expert parallelism]
// With an expert-parallel group of P ranks (MoEConfig::expertParallel), rank q holds experts [q E/P,
// (q+1) E/P) only (named by their global index, so checkpoints and HF names do not depend on P, and
// initialised with the random numbers the one-rank model gives them). Each rank routes its own tokens over
// all E experts as above, with its own capacity. Its kept rows go into a send buffer of E x capacity rows
// (expert-major, zero rows where an expert has fewer tokens), which one all_to_all turns into each rank's
// rows for its own experts from every rank; a second, small all_to_all of the per-expert counts says which
// received rows are real. Each local expert runs once on its rows from all ranks (contiguous, gathered),
// the outputs go back into the E x capacity layout, and a second all_to_all returns them to the tokens'
// ranks, where the combine is the one-rank combine. Backward runs the two exchanges in reverse (the
// gradient of an all_to_all is the all_to_all of its gradient). Every rank of the group runs the same
// exchanges in the same order, whatever its routing (each local expert runs on at least a zero row, so
// the exchanges are always in the graph).
//
// NOTE [Experts under tensor parallelism]
// With a tensor-parallel group (MoEConfig::tensorParallel; NOTE [Tensor parallelism] in nn/TensorParallel.h)
// each expert is split like the dense MLP: fc column-parallel, proj row-parallel, so an expert costs an
// all-reduce forward and one backward over the group. The router is whole on every rank. Every rank of the
// group holds the same tokens (the whole sequence: sequence parallelism is refused) and the same router, so
// it routes them alike and each expert runs on the same rows on every rank of the group, which keeps the
// group's collectives in step; with expert parallelism the expert-parallel group is made of ranks of one
// tensor rank (the same slices of different experts), and the rows an expert receives are the same on every
// rank of its tensor-parallel group too. The router's gradient is then equal on every rank of the group, as
// the other whole parameters' are.
#pragma once

#include <functional>
#include <vector>

#include "strata/core/Generator.h"
#include "strata/nn/Linear.h"
#include "strata/nn/ModuleList.h"
#include "strata/nn/TransformerBlock.h"

namespace strata::nn {

// NOTE [Expert parallelism]: this rank's place in the expert-parallel group, and the group's all_to_all
// (equal blocks: block i of `out` is block `rank` of rank i's `in`; ordered with the compute stream by the
// caller's function; host tensors too, for the routing counts). size 1: every expert here, no exchange.
struct ExpertParallel {
  int size = 1;
  int rank = 0;
  std::function<void(const Tensor& out, const Tensor& in)> allToAll;
};

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
  ExpertParallel expertParallel;
  // NOTE [Experts under tensor parallelism].
  TensorParallel tensorParallel;
};

// What the last forward routed.
struct MoEStats {
  std::vector<int64_t> tokensPerExpert;  // kept (token, expert) pairs per expert
  int64_t choices = 0;                   // tokens x k
  int64_t dropped = 0;                   // choices past their expert's capacity
  int64_t capacity = 0;
  // The unweighted auxiliary losses as scalars on the device (undefined before a forward): the forward does
  // not wait for them. auxLossValue() and zLossValue() read them, a host sync each, as the trainer does once
  // per log interval.
  Tensor auxLoss, zLoss;
  double droppedFraction() const { return choices > 0 ? double(dropped) / double(choices) : 0.0; }
  double auxLossValue() const;
  double zLossValue() const;
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
  // The experts this rank holds: global indices [firstExpert(), firstExpert() + numLocalExperts()).
  int64_t numLocalExperts() const { return config_.numExperts / config_.expertParallel.size; }
  int64_t firstExpert() const { return numLocalExperts() * config_.expertParallel.rank; }
  // Local expert e (global index firstExpert() + e).
  Mlp& expert(size_t e) { return dynamic_cast<Mlp&>(experts_->at(e)); }

 protected:
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  // NOTE [Expert parallelism]: from the send buffer [E x capacity, C] to the experts' outputs in the same
  // layout, through the group.
  Tensor exchangeThroughExperts(const Tensor& send, const std::vector<int64_t>& count, int64_t capacity);

  MoEConfig config_;
  std::shared_ptr<Linear> router_;
  std::shared_ptr<ModuleList> experts_;
  Tensor auxLoss_;
  MoEStats stats_;
};

}  // namespace strata::nn
