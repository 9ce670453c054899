#include "strata/nn/RelativePositionBias.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "strata/autograd/Functions.h"
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
  Tensor table =
      ops::randn({config.numBuckets, config.numHeads}, gen, DType::F32, config.device, 0, config.initStd);
  weight = registerParameter("weight", tp.active() ? columnSlice(table, 1, tp.size, tp.rank) : table);
}

std::map<std::string, TensorSlice> RelativePositionBias::ownSlices() const {
  if (!config_.tensorParallel.active()) return {};
  return {{"weight", TensorSlice{1, 1}}};
}

Tensor RelativePositionBias::apply(int64_t queryLen, int64_t keyLen, DType dtype) {
  STRATA_CHECK(weight.dtype() == dtype,
               "relative position bias: {} table asked for a {} bias; parameters are in the compute dtype",
               weight.dtype(), dtype);
  Tensor buckets = relativePositionBuckets(queryLen, keyLen, config_.bidirectional, config_.numBuckets,
                                           config_.maxDistance, weight.device());
  return (*this)(buckets);
}

std::vector<Tensor> RelativePositionBias::forwardImpl(const std::vector<Tensor>& inputs) {
  const Tensor& buckets = inputs.at(0);
  STRATA_CHECK(buckets.dim() == 2, "relative position bias: buckets must be [S_q, S_k], got {}",
               toString(buckets.shape()));
  // [Sq, Sk, H] -> [1, H, Sq, Sk]; the attention adds it with a broadcast over the batch. Made contiguous
  // once here, as the fused attention reads it (NOTE [Biased fused attention] in kernels/FlashAttention.cuh),
  // rather than by every layer.
  Tensor values = embedding(weight, buckets);
  return {values.permute({2, 0, 1}).contiguous().unsqueeze(0)};
}

}  // namespace strata::nn
