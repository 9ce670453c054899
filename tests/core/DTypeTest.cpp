#include <cmath>
#include <limits>

#include "TestUtil.h"

using namespace strata;

TEST_CASE("bf16 rounds to nearest even and keeps specials", "[core][dtype]") {
  REQUIRE(float(BFloat16(1.0f)) == 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  REQUIRE(float(BFloat16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  REQUIRE(float(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  REQUIRE(std::isinf(float(BFloat16(std::numeric_limits<float>::infinity()))));
  REQUIRE(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(float(BFloat16(-2.5f)) == -2.5f);
}

TEST_CASE("f16 conversion covers normals, subnormals and overflow", "[core][dtype]") {
  REQUIRE(float(Half(1.0f)) == 1.0f);
  REQUIRE(float(Half(65504.0f)) == 65504.0f);
  REQUIRE(std::isinf(float(Half(70000.0f))));
  REQUIRE(float(Half(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));  // smallest subnormal
  REQUIRE(float(Half(std::ldexp(1.0f, -26))) == 0.0f);
  REQUIRE(float(Half(0.1f)) == Approx(0.0999755859375f));
  for (float v : {0.333f, -1234.5f, 3.0e-5f, 1.0e-7f}) {
    float back = float(Half(v));
    REQUIRE(std::abs(back - v) <= std::max(std::abs(v) * 1e-3f, 6e-8f));
  }
}

TEST_CASE("dtype sizes, names and parsing", "[core][dtype]") {
  REQUIRE(dtypeSize(DType::BF16) == 2);
  REQUIRE(dtypeSize(DType::I64) == 8);
  REQUIRE(std::string(dtypeName(DType::F16)) == "f16");
  REQUIRE(dtypeFromName("bf16") == DType::BF16);
  REQUIRE(dtypeFromName("fp32") == DType::F32);
  REQUIRE_THROWS_AS(dtypeFromName("f8"), Error);
  REQUIRE(Device::parse("cuda:1") == Device::cuda(1));
  REQUIRE_THROWS_AS(Device::parse("tpu"), Error);
}
