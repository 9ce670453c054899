// Reductions over the middle dim of a contiguous [A, R, B] tensor (sum or max), fp32 accumulation.
//
// - B == 1 (rows): grid (A, splits), one block reduces a slice of one row: strided loads, warp shuffles, then
//   shared memory across warps.
// - B > 1 (columns): grid (ceil(B/32), A, splits), block (32, 8): lanes take consecutive columns (coalesced), the
//   8 rows of threads split R and combine in shared memory.
// With splits > 1 each block writes a partial result to an fp32 [A, splits, B] buffer and the launcher reduces that
// buffer in a second pass, so results are deterministic (no atomics).
#pragma once

#include "kernels/Common.cuh"

namespace strata::kernels {

struct SumReduce {
  static __device__ __forceinline__ float identity() { return 0.0f; }
  static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
};
struct MaxReduce {
  static __device__ __forceinline__ float identity() { return -INFINITY; }
  static __device__ __forceinline__ float combine(float a, float b) { return fmaxf(a, b); }
};

template <class Op, class T, class U>
__global__ void reduceRowsKernel(const T* __restrict__ in, U* __restrict__ out, int64_t R, int64_t chunk) {
  __shared__ float scratch[32];
  int64_t a = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  int64_t begin = split * chunk, end = min(R, begin + chunk);
  const T* row = in + a * R;
  float acc = Op::identity();
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc = Op::combine(acc, float(toAcc(row[r])));
  // Block reduction with the op.
  for (int o = 16; o > 0; o >>= 1) acc = Op::combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < warps ? scratch[lane] : Op::identity();
    for (int o = 16; o > 0; o >>= 1) acc = Op::combine(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) out[a * splits + split] = fromAcc<U>(acc);
  }
}

template <class Op, class T, class U>
__global__ void reduceColumnsKernel(const T* __restrict__ in, U* __restrict__ out, int64_t R, int64_t B,
                                    int64_t chunk) {
  __shared__ float scratch[8][33];
  int64_t b = int64_t(blockIdx.x) * 32 + threadIdx.x;
  int64_t a = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  int64_t begin = split * chunk, end = min(R, begin + chunk);
  float acc = Op::identity();
  if (b < B) {
    const T* base = in + a * R * B + b;
    for (int64_t r = begin + threadIdx.y; r < end; r += blockDim.y) acc = Op::combine(acc, float(toAcc(base[r * B])));
  }
  scratch[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && b < B) {
    for (int y = 1; y < blockDim.y; ++y) acc = Op::combine(acc, scratch[y][threadIdx.x]);
    out[(a * splits + split) * B + b] = fromAcc<U>(acc);
  }
}

}  // namespace strata::kernels
