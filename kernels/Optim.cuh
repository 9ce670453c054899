// Fused multi-tensor AdamW.
//
// The launcher cuts every tensor into chunks of kAdamChunk elements and passes one descriptor per chunk;
// block b updates chunk b: param, m and v in place from the gradient times an optional device-side scale
// (clipping coefficient), so one launch updates every parameter and no host sync is needed. float4 loads when
// all four pointers of a chunk are 16-byte aligned (a 16-bit gradient, m or v: 8-byte aligned). A bf16 or
// f16 gradient is widened to fp32 as it is read (exactly). m and v are fp32, or bf16 in a launch of their
// own (kBf16Moments, optimizer.moments_dtype): widened as they are read, rounded to nearest even as written.
#pragma once

#include "kernels/Common.cuh"

namespace strata::kernels {

constexpr int64_t kAdamChunk = 65536;

struct AdamChunk {
  float* param;
  const void* grad;  // fp32, or bf16 / f16 (gradKind)
  void* m;           // fp32, or bf16 in the kBf16Moments kernel
  void* v;
  int64_t n;
  float decay;   // adamwDecayFactor(lr, weight decay), from the host
  void* copy;    // copy of param written with the update (rounded to 16 bits, or fp32), or null
  int copyKind;  // 0: none, 1: bf16, 2: f16, 3: f32
  int gradKind;  // 0: f32, 1: bf16, 2: f16
};

__device__ __forceinline__ float widen16(uint16_t bits, int kind) {
  if (kind == 1) return __uint_as_float(uint32_t(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Four gradients from element 4i (vector path).
__device__ __forceinline__ float4 grads4(const AdamChunk& c, int64_t i) {
  if (c.gradKind == 0) return reinterpret_cast<const float4*>(c.grad)[i];
  ushort4 b = reinterpret_cast<const ushort4*>(c.grad)[i];
  return float4{widen16(b.x, c.gradKind), widen16(b.y, c.gradKind), widen16(b.z, c.gradKind),
                widen16(b.w, c.gradKind)};
}

__device__ __forceinline__ float gradAt(const AdamChunk& c, int64_t i) {
  if (c.gradKind == 0) return static_cast<const float*>(c.grad)[i];
  return widen16(static_cast<const uint16_t*>(c.grad)[i], c.gradKind);
}

__device__ __forceinline__ uint16_t roundTo16(float x, int kind) {
  if (kind == 1) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  return __half_as_ushort(__float2half_rn(x));
}

// The step's constants, computed on the host as the CPU kernel computes them (NOTE [AdamW bits] in
// strata/ops/Ops.h).
struct AdamParams {
  float negLr, beta1, oneMinusBeta1, beta2, oneMinusBeta2, eps, c1, c2;  // c1, c2: inverse bias corrections
};

// The CPU kernel's sequence of operations, with the intrinsics that keep nvcc from contracting products
// into fused multiply-adds (NOTE [AdamW bits]).
__device__ __forceinline__ void adamOne(float& p, float grad, float scale, float& m, float& v,
                                        const AdamParams& h, float decay) {
  float g = __fmul_rn(grad, scale);
  m = __fmaf_rn(h.beta1, m, __fmul_rn(h.oneMinusBeta1, g));
  v = __fmaf_rn(h.beta2, v, __fmul_rn(__fmul_rn(h.oneMinusBeta2, g), g));
  float update =
      __fdiv_rn(__fmul_rn(h.negLr, __fmul_rn(m, h.c1)), __fadd_rn(__fsqrt_rn(__fmul_rn(v, h.c2)), h.eps));
  p = __fmaf_rn(p, decay, update);
}

// Four moments from element 4i (vector path), and four stored.
template <bool kBf16Moments>
__device__ __forceinline__ float4 moments4(const void* moments, int64_t i) {
  if constexpr (!kBf16Moments) return static_cast<const float4*>(moments)[i];
  ushort4 b = static_cast<const ushort4*>(moments)[i];
  return float4{widen16(b.x, 1), widen16(b.y, 1), widen16(b.z, 1), widen16(b.w, 1)};
}

template <bool kBf16Moments>
__device__ __forceinline__ void setMoments4(void* moments, int64_t i, float4 x) {
  if constexpr (!kBf16Moments)
    static_cast<float4*>(moments)[i] = x;
  else
    static_cast<ushort4*>(moments)[i] =
        ushort4{roundTo16(x.x, 1), roundTo16(x.y, 1), roundTo16(x.z, 1), roundTo16(x.w, 1)};
}

template <bool kBf16Moments>
__device__ __forceinline__ float momentAt(const void* moments, int64_t i) {
  if constexpr (!kBf16Moments) return static_cast<const float*>(moments)[i];
  return widen16(static_cast<const uint16_t*>(moments)[i], 1);
}

template <bool kBf16Moments>
__device__ __forceinline__ void setMoment(void* moments, int64_t i, float x) {
  if constexpr (!kBf16Moments)
    static_cast<float*>(moments)[i] = x;
  else
    static_cast<uint16_t*>(moments)[i] = roundTo16(x, 1);
}

template <bool kBf16Moments>
__global__ void adamwKernel(const AdamChunk* __restrict__ chunks, AdamParams h,
                            const float* __restrict__ gradScale) {
  AdamChunk c = chunks[blockIdx.x];
  float scale = gradScale ? gradScale[0] : 1.0f;
  uint16_t* copy = c.copyKind == 1 || c.copyKind == 2 ? static_cast<uint16_t*>(c.copy) : nullptr;
  float* copy32 = c.copyKind == 3 ? static_cast<float*>(c.copy) : nullptr;
  uintptr_t grad = reinterpret_cast<uintptr_t>(c.grad);
  uintptr_t moments = reinterpret_cast<uintptr_t>(c.m) | reinterpret_cast<uintptr_t>(c.v);
  bool vec =
      ((reinterpret_cast<uintptr_t>(c.param) | (c.gradKind == 0 ? grad : 0) | (kBf16Moments ? 0 : moments) |
        reinterpret_cast<uintptr_t>(copy32)) &
       15u) == 0 &&
      ((reinterpret_cast<uintptr_t>(copy) | (c.gradKind == 0 ? 0 : grad) | (kBf16Moments ? moments : 0)) &
       7u) == 0;
  int64_t start = 0;
  if (vec) {
    int64_t n4 = c.n / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 p = reinterpret_cast<float4*>(c.param)[i], g = grads4(c, i);
      float4 m = moments4<kBf16Moments>(c.m, i), v = moments4<kBf16Moments>(c.v, i);
      adamOne(p.x, g.x, scale, m.x, v.x, h, c.decay);
      adamOne(p.y, g.y, scale, m.y, v.y, h, c.decay);
      adamOne(p.z, g.z, scale, m.z, v.z, h, c.decay);
      adamOne(p.w, g.w, scale, m.w, v.w, h, c.decay);
      reinterpret_cast<float4*>(c.param)[i] = p;
      setMoments4<kBf16Moments>(c.m, i, m);
      setMoments4<kBf16Moments>(c.v, i, v);
      if (copy) {
        ushort4 r{roundTo16(p.x, c.copyKind), roundTo16(p.y, c.copyKind), roundTo16(p.z, c.copyKind),
                  roundTo16(p.w, c.copyKind)};
        reinterpret_cast<ushort4*>(copy)[i] = r;
      }
      if (copy32) reinterpret_cast<float4*>(copy32)[i] = p;
    }
    start = n4 * 4;
  }
  for (int64_t i = start + threadIdx.x; i < c.n; i += blockDim.x) {
    float m = momentAt<kBf16Moments>(c.m, i), v = momentAt<kBf16Moments>(c.v, i);
    adamOne(c.param[i], gradAt(c, i), scale, m, v, h, c.decay);
    setMoment<kBf16Moments>(c.m, i, m);
    setMoment<kBf16Moments>(c.v, i, v);
    if (copy) copy[i] = roundTo16(c.param[i], c.copyKind);
    if (copy32) copy32[i] = c.param[i];
  }
}

// ---- sum of squares (gradient norm)
// Block b reduces chunk b into partial[b]; one block then sums the partials in a fixed order.
struct NormChunk {
  const float* data;
  int64_t n;
};

__global__ void sumSquaresKernel(const NormChunk* __restrict__ chunks, float* __restrict__ partial) {
  __shared__ float scratch[32];
  NormChunk c = chunks[blockIdx.x];
  float s = 0.0f;
  int64_t start = 0;
  if ((reinterpret_cast<uintptr_t>(c.data) & 15u) == 0) {
    int64_t n4 = c.n / 4;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(c.data)[i];
      s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    start = n4 * 4;
  }
  for (int64_t i = start + threadIdx.x; i < c.n; i += blockDim.x) s += c.data[i] * c.data[i];
  s = blockSum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumPartialsKernel(const float* __restrict__ partial, int n, float* __restrict__ out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += double(partial[i]);
  s = blockSum(s, scratch);
  if (threadIdx.x == 0) out[0] = float(s);
}

}  // namespace strata::kernels
