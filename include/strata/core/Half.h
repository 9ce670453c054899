// Host-side 16-bit float types. Conversions round to nearest even, bit-exact with CUDA's __float2bfloat16 and
// __float2half, so CPU and GPU kernels agree on every stored value.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(fromFloat(f)) {}  // NOLINT: implicit like a built-in float type
  operator float() const { return bitsFloat(uint32_t(bits) << 16); }

  static uint16_t fromFloat(float f) {
    uint32_t u = floatBits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(fromFloat(f)) {}  // NOLINT
  operator float() const { return toFloat(bits); }

  static uint16_t fromFloat(float f) {
    uint32_t u = floatBits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (absu >= 0x47800000u) {                                // overflow or inf (>= 65536 before rounding)
      // values in [65520, 65536) round to inf as well; handled by the normal path below when < 0x47800000
      return uint16_t(sign | 0x7c00u);
    }
    if (absu < 0x38800000u) {  // subnormal half or zero: |f| < 2^-14
      // Add a magic number so the FPU performs the round-to-nearest-even shift for us.
      float magic = bitsFloat(0x3f000000u);  // 0.5: aligns 2^-24 to the last mantissa bit
      float a = bitsFloat(absu) + magic;
      return uint16_t(sign | (floatBits(a) - floatBits(magic)));
    }
    uint32_t mantOdd = (absu >> 13) & 1u;
    absu += 0xc8000fffu + mantOdd;  // rebias exponent (-112 << 23) and round to nearest even
    return uint16_t(sign | (absu >> 13));
  }

  static float toFloat(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
      float v = float(mant) * bitsFloat(0x33800000u);  // mant * 2^-24
      return sign ? -v : v;
    }
    if (exp == 31) return bitsFloat(sign | 0x7f800000u | (mant << 13));
    return bitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

}  // namespace strata
