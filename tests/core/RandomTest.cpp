#include <cmath>

#include "TestUtil.h"
#include "strata/core/Philox.h"

using namespace strata;

TEST_CASE("philox is deterministic and counter based", "[core][random]") {
  PhiloxOut a = philox4x32(5, 42), b = philox4x32(5, 42), c = philox4x32(6, 42), d = philox4x32(5, 43);
  for (int i = 0; i < 4; ++i) REQUIRE(a.x[i] == b.x[i]);
  REQUIRE(a.x[0] != c.x[0]);
  REQUIRE(a.x[0] != d.x[0]);
  // Known-answer test from the Random123 distribution: philox4x32-10 with zero counter and key.
  PhiloxOut z = philox4x32(0, 0);
  REQUIRE(z.x[0] == 0x6627e8d5u);
  REQUIRE(z.x[1] == 0xe169c58du);
  REQUIRE(z.x[2] == 0xbc57ac4cu);
  REQUIRE(z.x[3] == 0x9b00dbd8u);
}

TEST_CASE("rand and randn have the right moments and replay by seed", "[core][random]") {
  Generator gen(7);
  Tensor u = ops::rand({100000}, gen);
  auto v = u.toVector<double>();
  double mean = 0, mn = 1, mx = 0;
  for (double x : v) {
    mean += x;
    mn = std::min(mn, x);
    mx = std::max(mx, x);
  }
  mean /= double(v.size());
  REQUIRE(mean == Approx(0.5).margin(0.01));
  REQUIRE(mn >= 0.0);
  REQUIRE(mx < 1.0);

  Tensor n = ops::randn({100000}, gen, DType::F32, Device::cpu(), 1.0, 2.0);
  auto w = n.toVector<double>();
  double m = 0, var = 0;
  for (double x : w) m += x;
  m /= double(w.size());
  for (double x : w) var += (x - m) * (x - m);
  var /= double(w.size());
  REQUIRE(m == Approx(1.0).margin(0.03));
  REQUIRE(std::sqrt(var) == Approx(2.0).margin(0.03));

  Generator again(7);
  REQUIRE(ops::rand({100000}, again).toVector<float>() == u.toVector<float>());
  REQUIRE(gen.state().offset == 200000);  // each draw reserves its own counters
}

TEST_CASE("dropout keeps about 1-p of the elements and scales them", "[core][random]") {
  Tensor x = ops::ones({50000});
  Tensor y = ops::dropout(x, 0.25, 11, 0);
  auto v = y.toVector<float>();
  size_t kept = 0;
  for (float e : v) {
    REQUIRE((e == 0.0f || std::abs(e - 1.0f / 0.75f) < 1e-6f));
    kept += e != 0.0f;
  }
  REQUIRE(double(kept) / double(v.size()) == Approx(0.75).margin(0.01));
  REQUIRE(ops::dropout(x, 0.25, 11, 0).toVector<float>() == v);
  REQUIRE(ops::dropout(x, 0.25, 11, 1).toVector<float>() != v);
}

TEST_CASE("dropout's draw is element offset + i of the counter space, eight to a Philox evaluation",
          "[core][random]") {
  // NOTE [Dropout bits]: the kernel evaluates one group of 8 counters at a time; a draw at any offset and of
  // any length must still give element i the bits of counter offset + i, so a draw at offset o + k equals the
  // tail of the draw at offset o.
  Tensor x = ops::ones({1003});
  uint32_t threshold = dropThreshold(0.3);
  for (uint64_t offset : {0u, 5u, 8u, 13u}) {
    auto y = ops::dropout(x, 0.3, 21, offset).toVector<float>();
    for (size_t i = 0; i < y.size(); ++i) {
      INFO("offset " << offset << " element " << i);
      REQUIRE((y[i] != 0.0f) == dropKeep(21, offset + i, threshold));
    }
    auto tail = ops::dropout(ops::ones({1000}), 0.3, 21, offset + 3).toVector<float>();
    REQUIRE(std::equal(tail.begin(), tail.end(), y.begin() + 3));
  }
  // The 16-bit threshold: p honoured to 1/65536, and the edges exact.
  REQUIRE(dropThreshold(0.0) == 0u);
  REQUIRE(dropThreshold(0.1) == 6554u);
  REQUIRE(dropThreshold(1.0) == 65536u);
  for (uint64_t g = 0; g < 64; ++g) {
    REQUIRE(dropKeepByte(3, g, 0) == 0xFFu);    // p = 0 keeps all
    REQUIRE(dropKeepByte(3, g, 65536u) == 0u);  // p = 1 keeps none
  }
  // Dropout's evaluations are not the uniform draws' (the top counter bit sets them apart).
  REQUIRE(dropKeepByte(3, 0, 32768u) != 0u);
  size_t same = 0;
  for (uint64_t c = 0; c < 256; ++c)
    same += (philox4x32(c, 3).x[0] == philox4x32(c | (uint64_t(1) << 63), 3).x[0]);
  REQUIRE(same == 0);
}

TEST_CASE("dropout draws start on a group of eight", "[core][random]") {
  Generator gen(4);
  REQUIRE(gen.reserve(5) == 0);
  REQUIRE(gen.reserve(3, 8) == 8);
  REQUIRE(gen.reserve(16, 8) == 16);
  REQUIRE(gen.state().offset == 32);
}
