#include "TestUtil.h"

using namespace strata;
using strata::test::requireClose;

namespace {
Tensor iota(const Shape& shape) {
  return ops::arange(0, double(numelOf(shape))).view(shape);
}
}  // namespace

TEST_CASE("tensor construction and host round trip", "[core][tensor]") {
  Tensor t = Tensor::fromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(t.shape() == Shape{2, 3});
  REQUIRE(t.strides() == Shape{3, 1});
  REQUIRE(t.numel() == 6);
  REQUIRE(t.dtype() == DType::F32);
  REQUIRE(t.isContiguous());
  REQUIRE(t.toVector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  REQUIRE(t.toVector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  REQUIRE_THROWS_AS(Tensor::fromVector<float>({1, 2, 3}, {2, 2}), Error);
  REQUIRE_THROWS_AS(t.data<double>(), Error);
  REQUIRE(ops::full({}, 7.5).item() == 7.5);
}

TEST_CASE("views share storage and follow strides", "[core][tensor][views]") {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, 4});
  REQUIRE(v.storage() == t.storage());
  REQUIRE(v.strides() == Shape{4, 1});
  REQUIRE(t.view({-1}).shape() == Shape{24});

  Tensor p = t.permute({2, 0, 1});
  REQUIRE(p.shape() == Shape{4, 2, 3});
  REQUIRE(p.strides() == Shape{1, 12, 4});
  REQUIRE(!p.isContiguous());
  REQUIRE(p.toVector<float>()[1] == 4.0f);  // element [0,0,1] = t[0,1,0]

  Tensor tr = t.transpose(0, 2);
  REQUIRE(tr.shape() == Shape{4, 3, 2});
  REQUIRE_THROWS_AS(tr.view({24}), Error);  // not expressible without a copy
  Tensor r = tr.reshape({24});              // reshape copies instead
  REQUIRE(r.isContiguous());
  REQUIRE(r.toVector<float>()[1] == 12.0f);

  Tensor n = t.narrow(1, 1, 2);
  REQUIRE(n.shape() == Shape{2, 2, 4});
  REQUIRE(n.offset() == 4);
  REQUIRE(n.toVector<float>()[0] == 4.0f);
  REQUIRE(t.select(0, 1).shape() == Shape{3, 4});
  REQUIRE(t.select(0, 1).toVector<float>()[0] == 12.0f);
  REQUIRE_THROWS_AS(t.narrow(1, 2, 2), Error);

  Tensor e = Tensor::fromVector<float>({1, 2, 3}, {3, 1}).expand({3, 4});
  REQUIRE(e.strides() == Shape{1, 0});
  REQUIRE(e.toVector<float>() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  REQUIRE_THROWS_AS(e.expand({3, 5}), Error);

  REQUIRE(t.unsqueeze(1).shape() == Shape{2, 1, 3, 4});
  REQUIRE(t.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  REQUIRE(t.unsqueeze(1).squeeze(1).shape() == Shape{2, 3, 4});
  REQUIRE(t.flatten(1).shape() == Shape{2, 12});
}

TEST_CASE("writing through a view changes the base", "[core][tensor][views]") {
  Tensor t = ops::zeros({3, 4});
  Tensor col = t.narrow(1, 2, 1);
  ops::fill(col, 5.0);
  auto v = t.toVector<float>();
  REQUIRE(v[2] == 5.0f);
  REQUIRE(v[6] == 5.0f);
  REQUIRE(v[3] == 0.0f);
  REQUIRE(ops::sum(t).item() == 15.0);
}

TEST_CASE("contiguous, clone and dtype conversion", "[core][tensor]") {
  Tensor t = iota({3, 4}).transpose(0, 1);
  Tensor c = t.contiguous();
  REQUIRE(c.isContiguous());
  REQUIRE(c.storage() != t.storage());
  REQUIRE(c.toVector<float>() == t.toVector<float>());
  Tensor same = c.contiguous();
  REQUIRE(same.storage() == c.storage());

  Tensor b = t.to(DType::BF16);
  REQUIRE(b.dtype() == DType::BF16);
  REQUIRE(b.toVector<float>() == t.toVector<float>());  // small integers are exact in bf16
  Tensor h = Tensor::fromVector<float>({0.1f, 1.0f / 3}, {2}).to(DType::F16);
  REQUIRE(h.toVector<float>()[0] == float(Half(0.1f)));
  Tensor i = Tensor::fromVector<float>({1.7f, -2.2f}, {2}).to(DType::I64);
  REQUIRE(i.toVector<int64_t>() == std::vector<int64_t>{1, -2});

  Tensor cl = c.clone();
  ops::fill(cl, 0.0);
  REQUIRE(ops::sum(c).item() == 66.0);
}

TEST_CASE("broadcast shapes", "[core][shape]") {
  REQUIRE(broadcastShapes({3, 1, 5}, {4, 1}) == Shape{3, 4, 5});
  REQUIRE(broadcastShapes({}, {2, 2}) == Shape{2, 2});
  REQUIRE_THROWS_AS(broadcastShapes({3}, {4}), Error);
  Tensor a = iota({2, 1, 3});
  Tensor b = iota({4, 1});
  Tensor s = ops::add(a, b);
  REQUIRE(s.shape() == Shape{2, 4, 3});
  auto v = s.toVector<float>();
  REQUIRE(v[0] == 0.0f);
  REQUIRE(v[3 * 3 + 2] == 2.0f + 3.0f);       // a[0,0,2] + b[3,0]
  REQUIRE(v[12 + 1 * 3 + 1] == 4.0f + 1.0f);  // a[1,0,1] + b[1,0]
}

TEST_CASE("printing names dtype, shape and values", "[core][tensor]") {
  std::ostringstream os;
  os << Tensor::fromVector<float>({1.5f, 2.0f}, {2});
  REQUIRE(os.str().find("f32") != std::string::npos);
  REQUIRE(os.str().find("[2]") != std::string::npos);
  REQUIRE(os.str().find("1.5") != std::string::npos);
}

TEST_CASE("errors name the failing values", "[core][errors]") {
  try {
    ops::add(ops::zeros({2, 3}), ops::zeros({4}));
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string msg = e.what();
    REQUIRE(msg.find("[2, 3]") != std::string::npos);
    REQUIRE(msg.find("[4]") != std::string::npos);
    REQUIRE(msg.find(".cpp:") != std::string::npos);
  }
}
