#include "TestUtil.h"

using namespace strata;

namespace {
Tensor iota(const Shape& shape) {
  return ops::arange(0, double(numelOf(shape))).view(shape);
}
}  // namespace

TEST_CASE("sum and mean over dims with keepdim", "[ops][reduce]") {
  Tensor t = iota({2, 3, 4});
  REQUIRE(ops::sum(t).item() == 276.0);
  REQUIRE(ops::sum(t).dim() == 0);
  Tensor s1 = ops::sum(t, {1});
  REQUIRE(s1.shape() == Shape{2, 4});
  REQUIRE(s1.toVector<float>() == std::vector<float>{12, 15, 18, 21, 48, 51, 54, 57});
  Tensor s02 = ops::sum(t, {0, 2}, true);
  REQUIRE(s02.shape() == Shape{1, 3, 1});
  REQUIRE(s02.toVector<float>() == std::vector<float>{60, 92, 124});
  REQUIRE(ops::mean(t, {-1}).toVector<float>()[0] == 1.5f);
  // Non-adjacent reduced dims on a permuted view.
  Tensor p = t.permute({2, 0, 1});
  REQUIRE(ops::sum(p, {0, 2}).toVector<float>() == std::vector<float>{66, 210});
}

TEST_CASE("amax and sumTo", "[ops][reduce]") {
  Tensor t = Tensor::fromVector<float>({3, -1, 7, 2, 9, -5}, {2, 3});
  REQUIRE(ops::amax(t, {1}).toVector<float>() == std::vector<float>{7, 9});
  REQUIRE(ops::amax(t, {0}).toVector<float>() == std::vector<float>{3, 9, 7});
  REQUIRE(ops::amax(t).item() == 9.0);
  Tensor g = ops::ones({4, 2, 3});
  REQUIRE(ops::sumTo(g, {2, 1}).shape() == Shape{2, 1});
  REQUIRE(ops::sumTo(g, {2, 1}).toVector<float>() == std::vector<float>{12, 12});
  REQUIRE(ops::sumTo(g, {3}).toVector<float>() == std::vector<float>{8, 8, 8});
}

TEST_CASE("large reductions accumulate in fp32 for bf16 inputs", "[ops][reduce]") {
  Tensor x = ops::full({1 << 16}, 1.0, DType::BF16);
  // bf16 accumulation would stall at 256; fp32 accumulation reaches 65536 exactly.
  REQUIRE(ops::sum(x).item() == 65536.0);
}
