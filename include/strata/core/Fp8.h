// The two 8-bit floating-point formats of FP8 training (NOTE [FP8 training] in autograd/Fp8.h), written once
// for the host and the device: the CPU emulation and the CUDA cast kernel call the same functions, so a code
// is the same bits on both.
//
// - E4M3 (OCP "fn" variant, what Hopper's tensor cores read): 4 exponent bits (bias 7), 3 mantissa bits, no
//   infinity, one NaN per sign (S.1111.111). Largest finite 448, smallest normal 2^-6, smallest subnormal
//   2^-9.
// - E5M2: 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like infinities and NaNs. Largest finite 57344,
//   smallest normal 2^-14, smallest subnormal 2^-16.
// Conversion from fp32 rounds to nearest, ties to even, and saturates: a finite value beyond the largest and
// an infinity become the largest finite value of their sign (CUDA's __NV_SATFINITE); a NaN becomes the
// format's NaN (0x7F for E4M3, 0x7E for E5M2) with the input's sign.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_FP8_HD __host__ __device__ __forceinline__
#else
#define STRATA_FP8_HD inline
#endif

namespace strata {

enum class Fp8Format : uint8_t { E4M3, E5M2 };

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

STRATA_FP8_HD float fp8Max(Fp8Format f) {
  return f == Fp8Format::E4M3 ? kFp8E4M3Max : kFp8E5M2Max;
}

namespace detail {

STRATA_FP8_HD uint32_t fp8FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

STRATA_FP8_HD float fp8BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// exponentBias, mantissa bits, the largest finite code and the NaN code of one format.
template <int Bias, int Mantissa, uint32_t MaxCode, uint32_t NanCode>
STRATA_FP8_HD uint8_t fp8Encode(float f, float maxFinite) {
  uint32_t u = fp8FloatBits(f);
  uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint8_t(sign | NanCode);
  // At or beyond the largest finite value (infinity included): saturate. Below it, rounding reaches at most
  // the largest finite value, which is representable.
  if (a >= fp8FloatBits(maxFinite)) return uint8_t(sign | MaxCode);
  int exponent = int(a >> 23) - 127;
  if (exponent >= 1 - Bias) {
    // A normal fp8 number: keep Mantissa bits of the fp32 mantissa, rounding the dropped ones to nearest
    // even (a carry moves into the exponent, as it should), then rebias the exponent.
    constexpr uint32_t shift = 23 - Mantissa;
    uint32_t r = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift;
    return uint8_t(sign | (r - (uint32_t(127 - Bias) << Mantissa)));
  }
  // A subnormal (or zero): the value in units of the smallest subnormal 2^(1 - Bias - Mantissa), rounded to
  // an integer, ties to even. The product is exact (a power of two); a result of 2^Mantissa is the smallest
  // normal's code.
  float units = fp8BitsFloat(a) * fp8BitsFloat(uint32_t(127 + Bias - 1 + Mantissa) << 23);
  return uint8_t(sign | uint32_t(rintf(units)));
}

template <int Bias, int Mantissa>
STRATA_FP8_HD float fp8Decode(uint8_t code) {
  uint32_t sign = uint32_t(code & 0x80u) << 24;
  uint32_t exponent = (code & 0x7fu) >> Mantissa, mantissa = code & ((1u << Mantissa) - 1u);
  if (exponent == 0) {
    // mantissa x 2^(1 - Bias - Mantissa), exact in fp32.
    float v = float(mantissa) * fp8BitsFloat(uint32_t(127 + 1 - Bias - Mantissa) << 23);
    return sign ? -v : v;
  }
  return fp8BitsFloat(sign | ((exponent - Bias + 127) << 23) | (mantissa << (23 - Mantissa)));
}

}  // namespace detail

// fp32 -> E4M3 / E5M2 code (see the top).
STRATA_FP8_HD uint8_t floatToE4M3(float f) {
  return detail::fp8Encode<7, 3, 0x7Eu, 0x7Fu>(f, kFp8E4M3Max);
}
STRATA_FP8_HD uint8_t floatToE5M2(float f) {
  return detail::fp8Encode<15, 2, 0x7Bu, 0x7Eu>(f, kFp8E5M2Max);
}
STRATA_FP8_HD uint8_t floatToFp8(float f, Fp8Format format) {
  return format == Fp8Format::E4M3 ? floatToE4M3(f) : floatToE5M2(f);
}

// E4M3 / E5M2 code -> fp32 (exact).
STRATA_FP8_HD float e4m3ToFloat(uint8_t code) {
  if ((code & 0x7fu) == 0x7fu) return detail::fp8BitsFloat(uint32_t(code & 0x80u) << 24 | 0x7fc00000u);
  return detail::fp8Decode<7, 3>(code);
}
STRATA_FP8_HD float e5m2ToFloat(uint8_t code) {
  // Exponent all ones: infinity (mantissa 0) or NaN, exactly as fp32's with the exponent widened.
  if ((code & 0x7cu) == 0x7cu)
    return detail::fp8BitsFloat((uint32_t(code & 0x80u) << 24) | 0x7f800000u | (uint32_t(code & 0x3u) << 21));
  return detail::fp8Decode<15, 2>(code);
}
STRATA_FP8_HD float fp8ToFloat(uint8_t code, Fp8Format format) {
  return format == Fp8Format::E4M3 ? e4m3ToFloat(code) : e5m2ToFloat(code);
}

// One layer's FP8 state (NOTE [FP8 training] in autograd/Fp8.h), fp32: for each tensor role (0: x, 1: W,
// 2: the output's gradient g) its scale and the scale's inverse, each at the start of a 16-byte slot of its
// own (cuBLASLt reads the inverses through its A/B scale pointers, and FP8 GEMMs take 16-byte aligned
// pointers), then the three amax histories of `history` entries each.
constexpr int64_t kFp8StateHeader = 24;
STRATA_FP8_HD constexpr int64_t fp8ScaleSlot(int role) {
  return 4 * role;
}
STRATA_FP8_HD constexpr int64_t fp8InverseSlot(int role) {
  return 12 + 4 * role;
}
STRATA_FP8_HD constexpr int64_t fp8HistorySlot(int role, int64_t history) {
  return kFp8StateHeader + role * history;
}
constexpr int64_t fp8StateElements(int64_t history) {
  return kFp8StateHeader + 3 * history;
}

// Delayed scaling's update (NOTE [FP8 training]): the scale that maps `amax` to the format's largest value,
// with `margin` powers of two to spare: (fp8Max / amax) / 2^margin. The previous scale stays when amax is
// zero (the tensor was all zeros, or not seen) or not finite. An amax so small that the quotient overflows
// (below about 1e-36) gives fp32's largest finite value, never infinity: an infinite scale would turn zeros
// into NaN codes (0 x inf) and its inverse, the GEMM's factor, into 0.
STRATA_FP8_HD float fp8NextScale(float amax, float previous, Fp8Format format, int margin) {
  if (!(amax > 0.0f) || !isfinite(amax)) return previous;
  float scale = (fp8Max(format) / amax) / ldexpf(1.0f, margin);
  return isfinite(scale) ? scale : 3.40282347e+38f;
}

}  // namespace strata
