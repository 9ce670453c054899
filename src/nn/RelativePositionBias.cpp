#include "strata/nn/RelativePositionBias.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "strata/autograd/Functions.h"
#include "strata/nn/DeferredInit.h"
#include "strata/ops/Ops.h"

namespace strata::nn {

int64_t relativePositionBucket(int64_t relativePosition, bool bidirectional, int64_t numBuckets,
                               int64_t maxDistance) {
  int64_t bucket = 0, n = relativePosition;
  if (bidirectional) {
    numBuckets /= 2;
    if (n > 0) bucket += numBuckets;
    n = std::abs(n);
  } else {
    n = -std::min<int64_t>(n, 0);
  }
  int64_t maxExact = numBuckets / 2;
  if (n < maxExact) return bucket + n;
  // HF: max_exact + (log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets -
  // max_exact)).long(), every step in fp32 (the Python double divisor is rounded to fp32 first).
  float ratio = float(n) / float(maxExact);
  float logScale = float(std::log(double(maxDistance) / double(maxExact)));
  float large = std::log(ratio) / logScale * float(numBuckets - maxExact);
  int64_t big = maxExact + int64_t(large);
  return bucket + std::min(big, numBuckets - 1);
}

Tensor relativePositionBuckets(int64_t queryLen, int64_t keyLen, bool bidirectional, int64_t numBuckets,
                               int64_t maxDistance, Device device, int64_t queryOffset) {
  STRATA_CHECK(queryLen > 0 && keyLen > 0 && numBuckets >= (bidirectional ? 4 : 2) && maxDistance > 0,
               "relative position buckets: bad sizes (queries {}, keys {}, buckets {}, max distance {})",
               queryLen, keyLen, numBuckets, maxDistance);
  std::vector<int64_t> buckets(size_t(queryLen * keyLen));
  for (int64_t i = 0; i < queryLen; ++i)
    for (int64_t j = 0; j < keyLen; ++j)
      buckets[size_t(i * keyLen + j)] =
          relativePositionBucket(j - (i + queryOffset), bidirectional, numBuckets, maxDistance);
  return Tensor::fromVector<int64_t>(buckets, {queryLen, keyLen}, device);
}

RelativePositionBias::RelativePositionBias(const RelativePositionBiasConfig& config, Generator& gen)
    : config_(config) {
  STRATA_CHECK(config.numHeads > 0 && config.numBuckets > 0, "relative position bias: {} heads, {} buckets",
               config.numHeads, config.numBuckets);
  const TensorParallel& tp = config.tensorParallel;
  STRATA_CHECK(config.numHeads % tp.size == 0,
               "relative position bias: {} heads do not split over {} tensor-parallel ranks", config.numHeads,
               tp.size);
  // The one-rank table's draws, then this rank's heads' columns.
  GeneratorState draws{gen.seed(), gen.reserve(uint64_t(config.numBuckets * config.numHeads))};
  Tensor table =
      initialParameter({config.numBuckets, config.numHeads / tp.size}, config.device, [config, draws] {
        const TensorParallel& tp = config.tensorParallel;
        Generator replay(draws);
        Tensor full = ops::randn({config.numBuckets, config.numHeads}, replay, DType::F32, config.device, 0,
                                 config.initStd);
        return tp.active() ? columnSlice(full, 1, tp.size, tp.rank) : full;
      });
  weight = registerParameter("weight", table);
}

std::map<std::string, TensorSlice> RelativePositionBias::ownSlices() const {
  if (!config_.tensorParallel.active()) return {};
  return {{"weight", TensorSlice{1, 1}}};
}

Tensor RelativePositionBias::apply(int64_t queryLen, int64_t keyLen, DType dtype) {
  STRATA_CHECK(weight.dtype() == dtype,
               "relative position bias: {} table asked for a {} bias; parameters are in the compute dtype",
               weight.dtype(), dtype);
  STRATA_CHECK(queryLen > 0 && keyLen > 0, "relative position bias: {} queries and {} keys", queryLen,
               keyLen);
  // NOTE [Relative bias by diagonals] in nn/RelativePositionBias.h.
  int64_t L = queryLen + keyLen - 1;
  std::vector<int64_t> wrapped(static_cast<size_t>(L));
  for (int64_t c = 0; c < L; ++c)
    wrapped[size_t(c)] = relativePositionBucket(c < keyLen ? c : c - L, config_.bidirectional,
                                                config_.numBuckets, config_.maxDistance);
  Tensor values = (*this)(Tensor::fromVector<int64_t>(wrapped, {L}, weight.device()));  // [L, H]
  int64_t H = values.size(1);
  Tensor slots = values.transpose(0, 1).unsqueeze(1);  // [H, 1, L]
  Tensor bias;
  if (queryLen == 1) {
    bias = slots.contiguous();  // L = S_k: slot j is distance j
  } else {
    Tensor rows = slots.expand({H, queryLen, L}).contiguous().reshape({H, queryLen * L});
    bias = rows.narrow(1, 0, queryLen * (L - 1)).view({H, queryLen, L - 1}).narrow(2, 0, keyLen);
  }
  // [1, H, Sq, Sk] with a contiguous last dim (row stride L - 1), as the fused attention reads it (NOTE
  // [Biased fused attention] in kernels/FlashAttention.cuh); the composed attention adds it by broadcast.
  return bias.unsqueeze(0);
}

std::vector<Tensor> RelativePositionBias::forwardImpl(const std::vector<Tensor>& inputs) {
  // Any shape of buckets -> their values [..., H].
  return {embedding(weight, inputs.at(0))};
}

}  // namespace strata::nn
