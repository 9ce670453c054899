// Philox-4x32-10 counter-based generator (Salmon et al., SC'11). The same function runs on the host and the
// device, so a (seed, offset) pair gives the same random numbers on the CPU and on CUDA.
//
// Element i of a draw that starts at `offset` uses counter (offset + i) and key `seed`. uniform() takes the
// top 24 bits of the first output word, which makes it exact in float on both sides. Dropout draws
// differently (NOTE [Dropout bits], below).
#pragma once

#include <math.h>
#include <cstdint>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define STRATA_HOST_DEVICE inline
#endif

namespace strata {

struct PhiloxOut {
  uint32_t x[4];
};

STRATA_HOST_DEVICE void philoxMulHiLo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

STRATA_HOST_DEVICE PhiloxOut philox4x32(uint64_t counter, uint64_t seed) {
  uint32_t c0 = uint32_t(counter), c1 = uint32_t(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philoxMulHiLo(0xD2511F53u, c0, hi0, lo0);
    philoxMulHiLo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return PhiloxOut{{c0, c1, c2, c3}};
}

// Uniform in [0, 1), exactly representable in float.
STRATA_HOST_DEVICE float philoxUniform(uint64_t seed, uint64_t index) {
  return float(philox4x32(index, seed).x[0] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller on two words of one draw.
STRATA_HOST_DEVICE float philoxNormal(uint64_t seed, uint64_t index) {
  PhiloxOut r = philox4x32(index, seed);
  float u1 = (float(r.x[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = float(r.x[1] >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.283185307179586f * u2);
}

// NOTE [Dropout bits]: element `index` of a dropout draw (offset + i) takes 16 bits of one Philox evaluation:
// counter (index / 8) with the top bit set, bits [16 (l % 2), 16 (l % 2) + 16) of word l / 2, l = index % 8.
// So 8 neighbours share one evaluation (a fused attention kernel draws a whole 8-key group at once, and the
// elementwise kernel one group per thread), and the top counter bit keeps dropout's evaluations apart from
// every other draw's (offsets stay far below 2^63). An element is kept when its 16 bits are >= threshold =
// round(p * 65536): p is honoured to 1/65536 (0.1 drops 6554/65536), and kept values are scaled by 1 / (1 -
// p).
inline uint32_t dropThreshold(double p) {
  if (!(p > 0.0)) return 0;
  if (p >= 1.0) return 65536u;
  return uint32_t(p * 65536.0 + 0.5);
}

// The keep bits of dropout group `group` (elements 8 group .. 8 group + 7): bit l for element 8 group + l.
STRATA_HOST_DEVICE uint32_t dropKeepByte(uint64_t seed, uint64_t group, uint32_t threshold) {
  PhiloxOut r = philox4x32(group | (uint64_t(1) << 63), seed);
  uint32_t bits = 0;
  for (int l = 0; l < 8; ++l) {
    uint32_t u = (r.x[l >> 1] >> ((l & 1) * 16)) & 0xFFFFu;
    bits |= uint32_t(u >= threshold) << l;
  }
  return bits;
}

// Whether dropout keeps element `index` of the counter space (offset + i).
STRATA_HOST_DEVICE bool dropKeep(uint64_t seed, uint64_t index, uint32_t threshold) {
  return (dropKeepByte(seed, index >> 3, threshold) >> (index & 7)) & 1u;
}

}  // namespace strata
