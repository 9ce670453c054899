// core/Fp8.h: fp32 -> E4M3/E5M2 -> fp32 at the edges, against values worked out by hand from the formats.
#include <cmath>
#include <cstdint>
#include <limits>

#include "TestUtil.h"
#include "strata/core/Fp8.h"
#include "strata/core/Half.h"

using namespace strata;

TEST_CASE("E4M3 conversion rounds to nearest even, saturates and keeps NaN", "[core][fp8]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  REQUIRE(floatToE4M3(0.0f) == 0x00);
  REQUIRE(floatToE4M3(-0.0f) == 0x80);
  REQUIRE(floatToE4M3(1.0f) == 0x38);  // 0.0111.000
  REQUIRE(floatToE4M3(-1.0f) == 0xB8);
  // 1 + 1/16 lies halfway between 1 (mantissa 000) and 1.125 (001): the even one; 1 + 3/16 between 1.125
  // and 1.25 (010): the even one again.
  REQUIRE(floatToE4M3(1.0625f) == 0x38);
  REQUIRE(floatToE4M3(1.1875f) == 0x3A);
  REQUIRE(floatToE4M3(1.07f) == 0x39);  // just past the tie
  // The largest finite value, and everything beyond it, infinity included, saturates to it.
  REQUIRE(floatToE4M3(448.0f) == 0x7E);
  REQUIRE(floatToE4M3(440.0f) == 0x7E);  // rounds up to 448 (1.71875 -> 1.75)
  REQUIRE(floatToE4M3(464.0f) == 0x7E);
  REQUIRE(floatToE4M3(1e9f) == 0x7E);
  REQUIRE(floatToE4M3(inf) == 0x7E);
  REQUIRE(floatToE4M3(-inf) == 0xFE);
  REQUIRE(floatToE4M3(nan) == 0x7F);
  // Subnormals: units of 2^-9; 2^-10 is a tie between 0 and 1 (even: 0), 1.5 x 2^-9 between 1 and 2 (2).
  REQUIRE(floatToE4M3(std::ldexp(1.0f, -9)) == 0x01);
  REQUIRE(floatToE4M3(std::ldexp(1.0f, -10)) == 0x00);
  REQUIRE(floatToE4M3(std::ldexp(1.5f, -10)) == 0x01);
  REQUIRE(floatToE4M3(std::ldexp(3.0f, -10)) == 0x02);
  REQUIRE(floatToE4M3(std::ldexp(7.0f, -9)) == 0x07);  // the largest subnormal
  REQUIRE(floatToE4M3(std::ldexp(1.0f, -6)) == 0x08);  // the smallest normal
  REQUIRE(floatToE4M3(std::ldexp(7.9f, -9)) == 0x08);  // a subnormal rounding up to it
  REQUIRE(floatToE4M3(1e-30f) == 0x00);

  REQUIRE(e4m3ToFloat(0x7E) == 448.0f);
  REQUIRE(e4m3ToFloat(0xFE) == -448.0f);
  REQUIRE(e4m3ToFloat(0x01) == std::ldexp(1.0f, -9));
  REQUIRE(e4m3ToFloat(0x08) == std::ldexp(1.0f, -6));
  REQUIRE(e4m3ToFloat(0x39) == 1.125f);
  REQUIRE(std::signbit(e4m3ToFloat(0x80)));
  REQUIRE(std::isnan(e4m3ToFloat(0x7F)));
  REQUIRE(std::isnan(e4m3ToFloat(0xFF)));
  // Every code but NaN survives the round trip.
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    REQUIRE(floatToE4M3(e4m3ToFloat(uint8_t(code))) == code);
  }
}

TEST_CASE("E5M2 conversion rounds to nearest even, saturates and keeps NaN", "[core][fp8]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  REQUIRE(floatToE5M2(1.0f) == 0x3C);    // 0.01111.00
  REQUIRE(floatToE5M2(1.125f) == 0x3C);  // halfway between 1 and 1.25: the even one
  REQUIRE(floatToE5M2(1.375f) == 0x3E);  // halfway between 1.25 and 1.5: the even one
  REQUIRE(floatToE5M2(57344.0f) == 0x7B);
  REQUIRE(floatToE5M2(61440.0f) == 0x7B);
  REQUIRE(floatToE5M2(inf) == 0x7B);
  REQUIRE(floatToE5M2(-inf) == 0xFB);
  REQUIRE(floatToE5M2(nan) == 0x7E);
  REQUIRE(floatToE5M2(std::ldexp(1.0f, -16)) == 0x01);  // the smallest subnormal
  REQUIRE(floatToE5M2(std::ldexp(1.0f, -17)) == 0x00);  // a tie with zero
  REQUIRE(floatToE5M2(std::ldexp(1.0f, -14)) == 0x04);  // the smallest normal

  REQUIRE(e5m2ToFloat(0x7B) == 57344.0f);
  REQUIRE(e5m2ToFloat(0x01) == std::ldexp(1.0f, -16));
  REQUIRE(e5m2ToFloat(0x7C) == std::numeric_limits<float>::infinity());
  REQUIRE(e5m2ToFloat(0xFC) == -std::numeric_limits<float>::infinity());
  REQUIRE(std::isnan(e5m2ToFloat(0x7D)));
  REQUIRE(std::isnan(e5m2ToFloat(0x7E)));
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7C) == 0x7C) continue;  // infinities and NaNs
    REQUIRE(floatToE5M2(e5m2ToFloat(uint8_t(code))) == code);
  }
}

TEST_CASE("bf16 values convert through their fp32 value", "[core][fp8]") {
  // bf16 300 is exact; between E4M3's 288 (0x79) and 320 (0x7A), nearer 288.
  REQUIRE(floatToE4M3(float(BFloat16(300.0f))) == 0x79);
  // E5M2: between 256 (0x5C) and 320 (0.10111.01), nearer 320.
  REQUIRE(floatToE5M2(float(BFloat16(300.0f))) == 0x5D);
  // bf16 -0.01 is -1.28125 x 2^-7, below E4M3's normals: 5.1225 units of 2^-9, so subnormal 5.
  REQUIRE(floatToE4M3(float(BFloat16(-0.01f))) == 0x85);
}

TEST_CASE("delayed scaling's next scale follows the recipe", "[core][fp8]") {
  // (fp8_max / amax) / 2^margin.
  REQUIRE(fp8NextScale(2.0f, 1.0f, Fp8Format::E4M3, 0) == 224.0f);
  REQUIRE(fp8NextScale(2.0f, 1.0f, Fp8Format::E4M3, 1) == 112.0f);
  REQUIRE(fp8NextScale(0.5f, 1.0f, Fp8Format::E5M2, 0) == 114688.0f);
  REQUIRE(fp8NextScale(3.0f, 1.0f, Fp8Format::E4M3, 0) == 448.0f / 3.0f);
  // An amax of zero or not finite keeps the previous scale.
  REQUIRE(fp8NextScale(0.0f, 7.0f, Fp8Format::E4M3, 0) == 7.0f);
  REQUIRE(fp8NextScale(std::numeric_limits<float>::infinity(), 7.0f, Fp8Format::E4M3, 0) == 7.0f);
  REQUIRE(fp8NextScale(std::nanf(""), 7.0f, Fp8Format::E5M2, 0) == 7.0f);
  // An amax so small that the quotient overflows gives the largest finite scale, which casts 0 to code 0.
  float tiny = fp8NextScale(1e-37f, 7.0f, Fp8Format::E4M3, 0);
  REQUIRE(tiny == std::numeric_limits<float>::max());
  REQUIRE(floatToE4M3(0.0f * tiny) == 0);
  REQUIRE(fp8NextScale(1e-37f, 7.0f, Fp8Format::E5M2, 2) == std::numeric_limits<float>::max());
}
