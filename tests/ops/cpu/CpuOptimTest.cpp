// The gradient norm's sum of squares in two halves (ops::sumOfSquaresParts, ops::sumParts) gives the bits of
// the sum in one call, however the tensors are split among the parts (NOTE [Gradient homes] in
// zero/GradientReducer.h: chunks take their partial sums at different times).
#include <cstring>

#include "TestUtil.h"

using namespace strata;

namespace {

Tensor randomFloats(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return ops::rand(shape, gen, DType::F32, Device::cpu(), -3.0, 3.0);
}

uint32_t bitsOf(const Tensor& scalar) {
  float f = static_cast<const float*>(scalar.data())[0];
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

}  // namespace

TEST_CASE("the sum of squares in parts equals the sum in one call bit for bit", "[ops][optim]") {
  // Sizes past the parallel grain, and views at an offset.
  std::vector<Tensor> tensors = {randomFloats({300007}, 1), randomFloats({7}, 2),
                                 randomFloats({1001}, 3).narrow(0, 1, 1000), randomFloats({65537}, 4),
                                 randomFloats({12345}, 5)};
  uint32_t whole = bitsOf(ops::sumOfSquares(tensors));
  for (size_t split = 0; split <= tensors.size(); ++split) {
    INFO("split at " << split);
    std::vector<Tensor> first(tensors.begin(), tensors.begin() + std::ptrdiff_t(split));
    std::vector<Tensor> second(tensors.begin() + std::ptrdiff_t(split), tensors.end());
    std::vector<Tensor> parts;
    for (const auto* half : {&first, &second})
      if (!half->empty()) parts.push_back(ops::sumOfSquaresParts(*half));
    REQUIRE(bitsOf(ops::sumParts(parts)) == whole);
  }
  // One part per tensor, as a chunk of one parameter gives.
  std::vector<Tensor> single;
  for (const Tensor& t : tensors) single.push_back(ops::sumOfSquaresParts({t}));
  REQUIRE(bitsOf(ops::sumParts(single)) == whole);
  // And it is the sum of the squares.
  double exact = 0;
  for (const Tensor& t : tensors)
    for (float x : t.contiguous().toVector<float>()) exact += double(x) * double(x);
  REQUIRE(ops::sumParts(single).item() == Approx(exact).epsilon(1e-6));
}
