// Row kernels over the last dim of contiguous [N, C] tensors: softmax / log-softmax and LayerNorm / RMSNorm,
// forward and backward.
//
// Parallelisation: one block per row; each thread walks the row in V-element packs (16-byte loads when the row is
// aligned, V = 1 otherwise). Statistics are reduced across the block (Common.cuh), then the row is read again to
// write the result; the second read of a row of a few KiB hits L1/L2, so HBM sees one read and one write.
// Softmax uses the online max/sum recurrence, so the first pass is a single read.
// Weight/bias gradients of the norms are column sums over rows, accumulated per block in shared memory inside the
// input-gradient kernel and reduced deterministically by the launcher.
#pragma once

#include "kernels/Common.cuh"

namespace strata::kernels {

template <class T, int V>
__device__ __forceinline__ void loadPack(const T* p, int64_t i, float (&out)[V]) {
  Vec<T, V> pack = reinterpret_cast<const Vec<T, V>*>(p)[i];
#pragma unroll
  for (int j = 0; j < V; ++j) out[j] = float(toAcc(pack.v[j]));
}

template <class T, int V>
__device__ __forceinline__ void storePack(T* p, int64_t i, const float (&in)[V]) {
  Vec<T, V> pack;
#pragma unroll
  for (int j = 0; j < V; ++j) pack.v[j] = fromAcc<T>(in[j]);
  reinterpret_cast<Vec<T, V>*>(p)[i] = pack;
}

// ---- softmax ------------------------------------------------------------------------------------------------------

template <class T, int V>
__global__ void softmaxKernel(const T* __restrict__ x, T* __restrict__ y, int64_t C, bool log) {
  __shared__ float sm[32], ss[32];
  const T* row = x + int64_t(blockIdx.x) * C;
  T* out = y + int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float v[V];
    loadPack<T, V>(row, i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) st = combine(st, MaxSum{v[j], 1.0f});
  }
  st = blockMaxSum(st, sm, ss);
  float logSum = logf(st.s), inv = 1.0f / st.s;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float v[V];
    loadPack<T, V>(row, i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = log ? v[j] - st.m - logSum : expf(v[j] - st.m) * inv;
    storePack<T, V>(out, i, v);
  }
}

template <class T, int V>
__global__ void softmaxBackwardKernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx,
                                      int64_t C, bool log) {
  __shared__ float scratch[32];
  int64_t base = int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float yv[V], gv[V];
    loadPack<T, V>(y + base, i, yv);
    loadPack<T, V>(gy + base, i, gv);
#pragma unroll
    for (int j = 0; j < V; ++j) dot += log ? gv[j] : gv[j] * yv[j];
  }
  dot = blockSum(dot, scratch);
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float yv[V], gv[V];
    loadPack<T, V>(y + base, i, yv);
    loadPack<T, V>(gy + base, i, gv);
#pragma unroll
    for (int j = 0; j < V; ++j) gv[j] = log ? gv[j] - expf(yv[j]) * dot : yv[j] * (gv[j] - dot);
    storePack<T, V>(gx + base, i, gv);
  }
}

// ---- LayerNorm / RMSNorm ------------------------------------------------------------------------------------------

template <class T, int V>
__global__ void normKernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           T* __restrict__ y, float* __restrict__ meanOut, float* __restrict__ rstdOut, int64_t C,
                           float eps, bool rms) {
  __shared__ float scratch[32];
  int64_t base = int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float v[V];
      loadPack<T, V>(x + base, i, v);
#pragma unroll
      for (int j = 0; j < V; ++j) s += v[j];
    }
    mean = blockSum(s, scratch) / float(C);
  }
  float sq = 0.0f;
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float v[V];
    loadPack<T, V>(x + base, i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) sq += (v[j] - mean) * (v[j] - mean);
  }
  float rstd = rsqrtf(blockSum(sq, scratch) / float(C) + eps);
  if (threadIdx.x == 0) {
    if (meanOut) meanOut[blockIdx.x] = mean;
    rstdOut[blockIdx.x] = rstd;
  }
  for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
    float v[V], wv[V], bv[V];
    loadPack<T, V>(x + base, i, v);
    if (w) loadPack<T, V>(w, i, wv);
    if (b) loadPack<T, V>(b, i, bv);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float o = (v[j] - mean) * rstd;
      if (w) o *= wv[j];
      if (b) o += bv[j];
      v[j] = o;
    }
    storePack<T, V>(y + base, i, v);
  }
}

// Input gradient, and (PARAMS) this block's partial weight/bias gradients. Blocks stride over rows; each thread
// owns the same columns in every row, so it accumulates them in shared memory without atomics. Partials are
// written as fp32 [gridDim.x, C] and summed by a second pass, so the gradients are deterministic.
template <class T, int V, bool PARAMS>
__global__ void normBackwardKernel(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ meanIn, const float* __restrict__ rstdIn,
                                   T* __restrict__ gx, float* __restrict__ gwPartial, float* __restrict__ gbPartial,
                                   int64_t N, int64_t C, bool rms) {
  __shared__ float scratch[32];
  extern __shared__ float params[];  // [2 * C] when PARAMS: weight then bias accumulators
  int64_t packs = C / V;
  if (PARAMS) {
    for (int64_t c = threadIdx.x; c < 2 * C; c += blockDim.x) params[c] = 0.0f;
  }
  float invC = 1.0f / float(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    int64_t base = n * C;
    float mean = meanIn ? meanIn[n] : 0.0f, rstd = rstdIn[n];
    float sumG = 0.0f, sumGX = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float g[V], v[V], wv[V];
      loadPack<T, V>(gy + base, i, g);
      loadPack<T, V>(x + base, i, v);
      if (w) loadPack<T, V>(w, i, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float gw = w ? g[j] * wv[j] : g[j];
        float xhat = (v[j] - mean) * rstd;
        sumG += gw;
        sumGX += gw * xhat;
        if (PARAMS) {
          params[i * V + j] += g[j] * xhat;
          params[C + i * V + j] += g[j];
        }
      }
    }
    sumGX = blockSum(sumGX, scratch);
    if (!rms) sumG = blockSum(sumG, scratch);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float g[V], v[V], wv[V];
      loadPack<T, V>(gy + base, i, g);
      loadPack<T, V>(x + base, i, v);
      if (w) loadPack<T, V>(w, i, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        float gw = w ? g[j] * wv[j] : g[j];
        float xhat = (v[j] - mean) * rstd;
        g[j] = rms ? rstd * (gw - xhat * sumGX * invC) : rstd * (gw - (sumG + xhat * sumGX) * invC);
      }
      storePack<T, V>(gx + base, i, g);
    }
  }
  if (PARAMS) {
    __syncthreads();
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      if (gwPartial) gwPartial[int64_t(blockIdx.x) * C + c] = params[c];
      if (gbPartial) gbPartial[int64_t(blockIdx.x) * C + c] = params[C + c];
    }
  }
}

}  // namespace strata::kernels
