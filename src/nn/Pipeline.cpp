#include "strata/nn/Pipeline.h"

#include <algorithm>
#include <limits>

#include "strata/core/Error.h"

namespace strata::nn {

std::vector<BlockRange> balancedSplit(const std::vector<double>& blockCost, double firstExtra,
                                      double lastExtra, int64_t parts) {
  const int64_t n = int64_t(blockCost.size());
  STRATA_CHECK(parts >= 1, "balancedSplit: {} parts", parts);
  STRATA_USER_CHECK(n >= parts,
                    "the model has {} blocks (model.num_layers) for {} model chunks (parallel.pipeline x "
                    "parallel.virtual_stages): every chunk needs a block; lower parallel.pipeline or "
                    "parallel.virtual_stages",
                    n, parts);
  std::vector<double> prefix(size_t(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + blockCost[size_t(i)];
  auto cost = [&](int64_t part, int64_t begin, int64_t end) {
    double c = prefix[size_t(end)] - prefix[size_t(begin)];
    if (part == 0) c += firstExtra;
    if (part == parts - 1) c += lastExtra;
    return c;
  };
  // best[k][e]: the least largest cost of splitting blocks [0, e) into chunks 0 .. k - 1; from[k][e] the
  // begin of chunk k - 1 there.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(parts) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int64_t>> from(size_t(parts) + 1, std::vector<int64_t>(size_t(n) + 1, 0));
  best[0][0] = 0;
  for (int64_t k = 1; k <= parts; ++k)
    for (int64_t e = k; e <= n - (parts - k); ++e)
      for (int64_t b = k - 1; b < e; ++b) {
        double c = std::max(best[size_t(k) - 1][size_t(b)], cost(k - 1, b, e));
        // Strictly smaller only: the earliest begin wins a tie, so equally good splits give the earlier
        // chunks fewer blocks (under 1F1B the first stages keep the most micro-batches in flight).
        if (c < best[size_t(k)][size_t(e)] * (1 - 1e-12)) {
          best[size_t(k)][size_t(e)] = c;
          from[size_t(k)][size_t(e)] = b;
        }
      }
  std::vector<BlockRange> ranges(static_cast<size_t>(parts));
  int64_t end = n;
  for (int64_t k = parts; k >= 1; --k) {
    int64_t begin = from[size_t(k)][size_t(end)];
    ranges[size_t(k) - 1] = BlockRange{begin, end};
    end = begin;
  }
  return ranges;
}

}  // namespace strata::nn
