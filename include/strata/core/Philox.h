// Philox-4x32-10 counter-based generator (Salmon et al., SC'11). The same function runs on the host and the
// device, so a (seed, offset) pair gives the same random numbers on the CPU and on CUDA.
//
// Element i of a draw that starts at `offset` uses counter (offset + i) and key `seed`. uniform() takes the
// top 24 bits of the first output word, which makes it exact in float on both sides.
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

}  // namespace strata
