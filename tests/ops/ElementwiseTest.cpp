#include <cmath>

#include "TestUtil.h"

using namespace strata;

namespace {
std::vector<double> mapHost(const std::vector<double>& x, double (*f)(double)) {
  std::vector<double> out;
  for (double v : x) out.push_back(f(v));
  return out;
}
}  // namespace

TEST_CASE("unary ops match the C library", "[ops][elementwise]") {
  Tensor x = test::randomDouble({37}, 1, 0.1, 3.0);
  auto xv = x.toVector<double>();
  auto check = [&](const Tensor& got, double (*f)(double)) {
    REQUIRE(test::closeness(got.toVector<double>(), mapHost(xv, f), 1e-12, 1e-12) <= 1.0);
  };
  check(ops::exp(x), [](double v) { return std::exp(v); });
  check(ops::log(x), [](double v) { return std::log(v); });
  check(ops::sqrt(x), [](double v) { return std::sqrt(v); });
  check(ops::rsqrt(x), [](double v) { return 1.0 / std::sqrt(v); });
  check(ops::tanh(x), [](double v) { return std::tanh(v); });
  check(ops::neg(x), [](double v) { return -v; });
  check(ops::sigmoid(x), [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
  check(ops::pow(x, 2.5), [](double v) { return std::pow(v, 2.5); });
  check(ops::affine(x, 3.0, -1.0), [](double v) { return 3 * v - 1; });
}

TEST_CASE("activations match their definitions", "[ops][elementwise]") {
  Tensor x = test::randomDouble({41}, 2, -4.0, 4.0);
  auto xv = x.toVector<double>();
  auto check = [&](const Tensor& got, double (*f)(double)) {
    REQUIRE(test::closeness(got.toVector<double>(), mapHost(xv, f), 1e-12, 1e-10) <= 1.0);
  };
  check(ops::relu(x), [](double v) { return v > 0 ? v : 0.0; });
  check(ops::silu(x), [](double v) { return v / (1 + std::exp(-v)); });
  check(ops::geluErf(x), [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); });
  check(ops::geluTanh(x), [](double v) {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  });
  // The two GELUs agree to about 1e-3.
  REQUIRE(test::closeness(ops::geluTanh(x).toVector<double>(), ops::geluErf(x).toVector<double>(), 2e-3, 0) <=
          1.0);
}

TEST_CASE("binary ops broadcast and compare", "[ops][elementwise]") {
  Tensor a = Tensor::fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::fromVector<float>({10, 20, 30}, {3});
  REQUIRE(ops::add(a, b).toVector<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  REQUIRE(ops::sub(b, a).toVector<float>() == std::vector<float>{9, 18, 27, 6, 15, 24});
  REQUIRE(ops::mul(a, b).toVector<float>() == std::vector<float>{10, 40, 90, 40, 100, 180});
  REQUIRE(ops::div(b, a).toVector<float>()[1] == 10.0f);
  Tensor c = Tensor::fromVector<float>({2}, {1, 1});
  REQUIRE(ops::maximum(a, c).toVector<float>() == std::vector<float>{2, 2, 3, 4, 5, 6});
  REQUIRE(ops::gt(a, c).toVector<float>() == std::vector<float>{0, 0, 1, 1, 1, 1});
  REQUIRE(ops::eq(a, c).toVector<float>() == std::vector<float>{0, 1, 0, 0, 0, 0});
  // Non-contiguous operand.
  Tensor at = a.transpose(0, 1);  // [3, 2]
  Tensor col = Tensor::fromVector<float>({100, 200, 300}, {3, 1});
  REQUIRE(ops::add(at, col).toVector<float>() == std::vector<float>{101, 104, 202, 205, 303, 306});
  REQUIRE_THROWS_AS(ops::add(a, ops::zeros({2, 3}, DType::F64)), Error);
  REQUIRE_THROWS_AS(ops::exp(Tensor::fromVector<int64_t>({1}, {1})), Error);
}

TEST_CASE("where and masked fill select by a mask of any dtype", "[ops][elementwise]") {
  Tensor mask = Tensor::fromVector<uint8_t>({1, 0, 0, 1}, {4});
  Tensor a = Tensor::fromVector<float>({1, 2, 3, 4}, {4});
  Tensor b = ops::full({}, -1.0);
  REQUIRE(ops::where(mask, a, b).toVector<float>() == std::vector<float>{1, -1, -1, 4});
  Tensor filled = maskedFill(a, mask, 9.0);
  REQUIRE(filled.toVector<float>() == std::vector<float>{9, 2, 3, 9});
}

TEST_CASE("bf16 and f16 elementwise compute in fp32 and round once", "[ops][elementwise]") {
  Tensor x = Tensor::fromVector<float>({0.1f, 1.7f, -3.3f, 100.25f}, {4});
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor y = ops::exp(ops::affine(x.to(dt), 0.01, 0.0));
    auto got = y.toVector<float>();
    auto xs = x.to(dt).toVector<float>();
    for (size_t i = 0; i < got.size(); ++i) {
      float expect = std::exp(xs[i] * 0.01f);
      float rounded = dt == DType::BF16 ? float(BFloat16(expect)) : float(Half(expect));
      REQUIRE(std::abs(got[i] - rounded) <= std::abs(expect) * (dt == DType::BF16 ? 8e-3f : 1e-3f));
    }
  }
}

TEST_CASE("addInPlace writes add's result into its destination", "[ops][elementwise]") {
  Generator gen(21);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor a = ops::rand({5, 67}, gen, DType::F32, Device::cpu(), -1, 1).to(dt);
    Tensor b = ops::rand({67, 5}, gen, DType::F32, Device::cpu(), -1, 1).to(dt).transpose(0, 1);  // strided
    Tensor expected = ops::add(a, b);
    Tensor dst = a.clone();
    uint64_t version = dst.storage()->version();
    ops::addInPlace(dst, b);
    REQUIRE(dst.to(DType::F32).toVector<float>() == expected.to(DType::F32).toVector<float>());
    REQUIRE(dst.storage()->version() != version);
    // The destination may be the source itself.
    Tensor twice = ops::add(dst, dst);
    ops::addInPlace(dst, dst);
    REQUIRE(dst.to(DType::F32).toVector<float>() == twice.to(DType::F32).toVector<float>());
  }
  Tensor f = ops::zeros({4});
  REQUIRE_THROWS_AS(ops::addInPlace(f, ops::zeros({5})), Error);
  REQUIRE_THROWS_AS(ops::addInPlace(f, ops::zeros({4}, DType::F64)), Error);
  REQUIRE_THROWS_AS(ops::addInPlace(ops::zeros({4, 4}).transpose(0, 1), ops::zeros({4, 4})), Error);
}
