// Device-side building blocks shared by every kernel file.
//
// - Storage types map to device types (BFloat16 -> __nv_bfloat16, Half -> __half); arithmetic happens in the
//   accumulate type (float, or double for f64) and results are rounded once on store, round-to-nearest-even,
//   the same rounding as the host conversions in core/Half.h.
// - Vec<T, N>: an aligned N-element pack for 16-byte loads and stores.
// - Warp and block reductions over float values (blockDim.x a multiple of 32, at most 1024).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "strata/core/DType.h"

namespace strata::kernels {

template <class T>
struct DeviceTypeOf {
  using type = T;
};
template <>
struct DeviceTypeOf<BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceTypeOf<Half> {
  using type = __half;
};
template <class T>
using DevT = typename DeviceTypeOf<T>::type;

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using AccT = typename AccOf<T>::type;

__device__ __forceinline__ float toAcc(float x) {
  return x;
}
__device__ __forceinline__ double toAcc(double x) {
  return x;
}
__device__ __forceinline__ float toAcc(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float toAcc(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T fromAcc(float x);
template <>
__device__ __forceinline__ float fromAcc<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromAcc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half fromAcc<__half>(float x) {
  return __float2half_rn(x);
}
template <class T>
__device__ __forceinline__ T fromAcc(double x) {
  return T(x);
}

// Conversions between any two storage types, through double (floats) or directly (integers).
template <class T>
__device__ __forceinline__ double toDouble(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return double(__bfloat162float(x));
  else if constexpr (std::is_same_v<T, __half>)
    return double(__half2float(x));
  else
    return double(x);
}
template <class T>
__device__ __forceinline__ T fromDouble(double x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(float(x));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(float(x));
  else
    return T(x);
}

template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Elements per 16-byte pack.
template <class T>
constexpr int kVec = 16 / sizeof(T) > 0 ? int(16 / sizeof(T)) : 1;

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warpSum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 values.
template <class A>
__device__ __forceinline__ A blockSum(A v, A* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpSum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : A(0);
  return warpSum(v);
}

// Two sums reduced together: one pair of barriers instead of two. `scratch` holds 64 values.
__device__ __forceinline__ float2 blockSum2(float2 v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v.x = warpSum(v.x);
  v.y = warpSum(v.y);
  __syncthreads();
  if (lane == 0) {
    scratch[warp] = v.x;
    scratch[32 + warp] = v.y;
  }
  __syncthreads();
  v.x = lane < warps ? scratch[lane] : 0.0f;
  v.y = lane < warps ? scratch[32 + lane] : 0.0f;
  return make_float2(warpSum(v.x), warpSum(v.y));
}

__device__ __forceinline__ float blockMax(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warpMax(v);
}

// Online softmax state: running max m and sum s of exp(x - m).
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
__device__ __forceinline__ MaxSum blockMaxSum(MaxSum v, float* scratchM, float* scratchS) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, other);
  }
  __syncthreads();
  if (lane == 0) {
    scratchM[warp] = v.m;
    scratchS[warp] = v.s;
  }
  __syncthreads();
  v = lane < warps ? MaxSum{scratchM[lane], scratchS[lane]} : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, other);
  }
  return v;
}

}  // namespace strata::kernels
