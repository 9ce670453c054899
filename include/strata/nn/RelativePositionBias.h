// T5's relative position bias: a learned scalar per (bucket of key - query distance, head), added to the
// attention scores. One module per stack (encoder, decoder); its bias is computed once per forward and shared
// by every layer of the stack, as HF's T5 does (only block 0 holds the table there).
//
// NOTE [Relative bias by diagonals]
// Entry (i, j) of the bias depends on j - i alone, so apply() looks the table up for the L = Sq + Sk - 1
// distances only, in "wrapped" order (slot c holds distance c for c < Sk, c - L after), and spreads them
// over the Sq x Sk grid by a skew: L-long copies of those values laid end to end, one per query, read back
// with a row stride of L - 1, put slot (j - i) mod L, the slot of distance j - i, at (i, j). Every step is a
// view or a copy, whose backward is a sum over the queries, so neither a lookup of Sq Sk entries nor the
// ordered gather of their gradients into the table's few rows runs: at T5-base's 512 x 512 those two took
// about a third of a training step on the H200. The result's last dim is contiguous (row stride L - 1), as
// the fused attention reads it (NOTE [Biased fused attention] in kernels/FlashAttention.cuh).
#pragma once

#include "strata/core/Generator.h"
#include "strata/nn/Module.h"
#include "strata/nn/TensorParallel.h"

namespace strata::nn {

struct RelativePositionBiasConfig {
  int64_t numHeads = 0;
  int64_t numBuckets = 32;
  int64_t maxDistance = 128;
  // Encoder: keys before and after a query get separate buckets. Decoder: only keys at or before it count
  // (later ones share bucket 0; the causal mask hides them anyway).
  bool bidirectional = true;
  double initStd = 0.02;
  Device device = Device::cpu();
  // Split by heads (NOTE [Tensor parallelism] in nn/TensorParallel.h): this rank holds the columns of heads
  // [rank H / T, (rank + 1) H / T) of the one-rank table and makes the bias of those heads only.
  TensorParallel tensorParallel = {};
};

// The bucket of each relative position key - query, exactly as HF's T5Attention._relative_position_bucket:
// half the buckets (of the direction's share) hold exact distances, the rest grow logarithmically up to
// maxDistance, beyond which everything shares the last bucket. The logarithm is taken in fp32, as torch does.
int64_t relativePositionBucket(int64_t relativePosition, bool bidirectional, int64_t numBuckets,
                               int64_t maxDistance);
// The buckets of every (query i, key j) pair with key - query = j - i + (queryOffset): i64 [queryLen, keyLen]
// on `device`. queryOffset is the position of the first query (a decoder extending a cache).
Tensor relativePositionBuckets(int64_t queryLen, int64_t keyLen, bool bidirectional, int64_t numBuckets,
                               int64_t maxDistance, Device device, int64_t queryOffset = 0);

class RelativePositionBias : public Module, public TensorParallelSliced {
 public:
  RelativePositionBias(const RelativePositionBiasConfig& config, Generator& gen);
  // The additive attention bias [1, H, queryLen, keyLen] in `dtype` (the table's dtype: the compute dtype);
  // split by heads, this rank's [1, H / T, queryLen, keyLen]. Its last dim is contiguous, its rows are not
  // (NOTE [Relative bias by diagonals]).
  Tensor apply(int64_t queryLen, int64_t keyLen, DType dtype);

  // [numBuckets, numHeads]: HF's relative_attention_bias.weight, same layout (split: [numBuckets, H / T]).
  Tensor weight;

  std::map<std::string, TensorSlice> ownSlices() const override;

  const RelativePositionBiasConfig& config() const { return config_; }

 protected:
  // forward({buckets i64 of any shape}) -> {their values [..., H]}.
  std::vector<Tensor> forwardImpl(const std::vector<Tensor>& inputs) override;

 private:
  RelativePositionBiasConfig config_;
};

}  // namespace strata::nn
