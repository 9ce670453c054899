#include "TestUtil.h"
#include "strata/nn/Pipeline.h"

using namespace strata;
using strata::test::errorOf;

namespace {
std::vector<std::pair<int64_t, int64_t>> bounds(const std::vector<nn::BlockRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : ranges) out.emplace_back(r.begin, r.end);
  return out;
}
}  // namespace

TEST_CASE("balancedSplit minimises the costliest chunk, the head's and embedding's cost included",
          "[nn][pipeline]") {
  std::vector<double> even(8, 1.0);
  // Without extras: equal counts.
  CHECK(bounds(nn::balancedSplit(even, 0, 0, 4)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {4, 6}, {6, 8}});
  // A head worth two blocks leaves the last chunk fewer blocks: the best largest cost is 4 (3, 3, 2 + 2).
  CHECK(bounds(nn::balancedSplit(even, 0, 2.0, 3)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 8}});
  // An embedding worth a block on the first chunk, a head worth three on the last: the last chunk's one block
  // costs 4, the best largest cost, and the first stages take fewer blocks (costs 2, 3, 3, 4).
  CHECK(bounds(nn::balancedSplit(even, 1.0, 3.0, 4)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 4}, {4, 7}, {7, 8}});
  // Every chunk keeps a block however heavy the head.
  auto heaviest = nn::balancedSplit(std::vector<double>(4, 1.0), 0, 100.0, 4);
  for (const auto& r : heaviest) CHECK(r.end - r.begin == 1);
  // Equally good splits give the earlier chunks fewer blocks.
  CHECK(bounds(nn::balancedSplit(std::vector<double>(5, 1.0), 0, 0, 2)) ==
        std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 5}});
  // Fewer blocks than chunks is refused naming the keys.
  CHECK(errorOf([] {
          nn::balancedSplit(std::vector<double>(3, 1.0), 0, 0, 4);
        }).find("lower parallel.pipeline or parallel.virtual_stages") != std::string::npos);
}
