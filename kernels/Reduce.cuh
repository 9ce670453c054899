// Reductions over the middle dim of a contiguous [A, R, B] tensor (sum or max), fp32 accumulation.
//
// - B == 1 (rows): grid (A, splits), one block reduces a slice of one row: strided loads, warp shuffles, then
//   shared memory across warps.
// - B > 1 (columns): grid (ceil(B/(32 V)), A, splits), block (32, 8): each lane takes V consecutive columns
// (a
//   16-byte pack when aligned), the 8 rows of threads split R and combine in shared memory.
// With splits > 1 each block writes a partial result to an fp32 [A, splits, B] buffer and the launcher
// reduces that buffer in a second pass, so results are deterministic (no atomics).
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
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x)
    acc = Op::combine(acc, float(toAcc(row[r])));
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

// Each thread reduces V adjacent columns (one 16-byte pack per row when V > 1).
template <class Op, class T, class U, int V>
__global__ void reduceColumnsKernel(const T* __restrict__ in, U* __restrict__ out, int64_t R, int64_t B,
                                    int64_t chunk) {
  __shared__ float scratch[8][32 * V + 1];
  int64_t b = (int64_t(blockIdx.x) * 32 + threadIdx.x) * V;
  int64_t a = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  int64_t begin = split * chunk, end = min(R, begin + chunk);
  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = Op::identity();
  if (b < B) {
    const T* base = in + a * R * B + b;
    // Four rows in flight per thread: independent loads hide memory latency.
    constexpr int kUnroll = 4;
    int64_t r = begin + threadIdx.y;
    for (; r + (kUnroll - 1) * int64_t(blockDim.y) < end; r += kUnroll * int64_t(blockDim.y)) {
      Vec<T, V> packs[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        packs[u] = *reinterpret_cast<const Vec<T, V>*>(base + (r + u * int64_t(blockDim.y)) * B);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = Op::combine(acc[j], float(toAcc(packs[u].v[j])));
    }
    for (; r < end; r += blockDim.y) {
      Vec<T, V> pack = *reinterpret_cast<const Vec<T, V>*>(base + r * B);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = Op::combine(acc[j], float(toAcc(pack.v[j])));
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) scratch[threadIdx.y][threadIdx.x * V + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && b < B) {
    for (int y = 1; y < blockDim.y; ++y)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = Op::combine(acc[j], scratch[y][threadIdx.x * V + j]);
#pragma unroll
    for (int j = 0; j < V; ++j) out[(a * splits + split) * B + b + j] = fromAcc<U>(acc[j]);
  }
}

}  // namespace strata::kernels
