// Row kernels over the last dim of contiguous [N, C] tensors: softmax / log-softmax and LayerNorm / RMSNorm,
// forward and backward.
//
// Layout: rows are split into V-element packs (16-byte loads when the row is aligned, V = 1 otherwise).
// Parallelisation: one block per row (the norm backward strides blocks over rows), at most 512 threads.
// Variants:
// - cached (P > 0): each thread holds its P packs of the row in registers, so HBM sees each input once and
// each
//   output once; statistics are reduced across the block between the register passes. Used up to 1024 * P
//   packs.
// - streamed (P = 0): for rows too wide for registers; re-reads the row, which then mostly hits L2.
// Softmax reduces the max first and then the sum of exponentials, one exp per element.
// The norm backward also accumulates the weight/bias gradients of the columns a thread owns in registers
// across the rows its block visits, and writes fp32 partials [gridDim.x, C]; the launcher sums them in a
// second pass, so the result is deterministic.
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

// Index of this thread's p-th pack.
__device__ __forceinline__ int64_t packIndex(int p) {
  return threadIdx.x + int64_t(p) * blockDim.x;
}

// ---- softmax
// ------------------------------------------------------------------------------------------------------

// Scales a loaded pack and hides columns at or past `visible` (causal attention) behind -inf.
template <int V>
__device__ __forceinline__ void scaleAndMask(float (&v)[V], int64_t pack, float scale, int64_t visible) {
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = pack * V + j < visible ? v[j] * scale : -INFINITY;
}

// softmax(scale * x) per row; with causalRows > 0, row r sees columns c <= r % causalRows + causalShift.
template <class T, int V, int P>
__global__ void __launch_bounds__(512)
    softmaxKernel(const T* __restrict__ x, T* __restrict__ y, int64_t C, bool log, float scale,
                  int64_t causalRows, int64_t causalShift) {
  __shared__ float scratch[32];
  const T* row = x + int64_t(blockIdx.x) * C;
  T* out = y + int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  int64_t visible = causalRows > 0 ? min(C, int64_t(blockIdx.x) % causalRows + causalShift + 1) : C;
  if constexpr (P > 0) {
    float v[P][V];
    float mx = -INFINITY;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) < packs) {
        loadPack<T, V>(row, packIndex(p), v[p]);
        scaleAndMask<V>(v[p], packIndex(p), scale, visible);
#pragma unroll
        for (int j = 0; j < V; ++j) mx = fmaxf(mx, v[p][j]);
      }
    }
    mx = blockMax(mx, scratch);
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          float e = expf(v[p][j] - mx);
          sum += e;
          if (!log) v[p][j] = e;
        }
      }
    }
    sum = blockSum(sum, scratch);
    float inv = 1.0f / sum, shift = mx + logf(sum);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[p][j] = log ? v[p][j] - shift : v[p][j] * inv;
        storePack<T, V>(out, packIndex(p), v[p]);
      }
    }
  } else {
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float v[V];
      loadPack<T, V>(row, i, v);
      scaleAndMask<V>(v, i, scale, visible);
#pragma unroll
      for (int j = 0; j < V; ++j) mx = fmaxf(mx, v[j]);
    }
    mx = blockMax(mx, scratch);
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float v[V];
      loadPack<T, V>(row, i, v);
      scaleAndMask<V>(v, i, scale, visible);
#pragma unroll
      for (int j = 0; j < V; ++j) sum += expf(v[j] - mx);
    }
    sum = blockSum(sum, scratch);
    float inv = 1.0f / sum, shift = mx + logf(sum);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float v[V];
      loadPack<T, V>(row, i, v);
      scaleAndMask<V>(v, i, scale, visible);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = log ? v[j] - shift : expf(v[j] - mx) * inv;
      storePack<T, V>(out, i, v);
    }
  }
}

template <class T, int V, int P>
__global__ void __launch_bounds__(512)
    softmaxBackwardKernel(const T* __restrict__ y, const T* __restrict__ gy, T* __restrict__ gx, int64_t C,
                          bool log, float scale) {
  __shared__ float scratch[32];
  int64_t base = int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  constexpr int R = P > 0 ? P : 1;
  float yc[R][V], gc[R][V];
  float dot = 0.0f;
  auto accumulate = [&](const float(&yv)[V], const float(&gv)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) dot += log ? gv[j] : gv[j] * yv[j];
  };
  auto finish = [&](const float(&yv)[V], float(&gv)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) gv[j] = scale * (log ? gv[j] - expf(yv[j]) * dot : yv[j] * (gv[j] - dot));
  };
  if constexpr (P > 0) {
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (packIndex(p) < packs) {
        loadPack<T, V>(y + base, packIndex(p), yc[p]);
        loadPack<T, V>(gy + base, packIndex(p), gc[p]);
        accumulate(yc[p], gc[p]);
      }
    dot = blockSum(dot, scratch);
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (packIndex(p) < packs) {
        finish(yc[p], gc[p]);
        storePack<T, V>(gx + base, packIndex(p), gc[p]);
      }
  } else {
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      loadPack<T, V>(y + base, i, yc[0]);
      loadPack<T, V>(gy + base, i, gc[0]);
      accumulate(yc[0], gc[0]);
    }
    dot = blockSum(dot, scratch);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      loadPack<T, V>(y + base, i, yc[0]);
      loadPack<T, V>(gy + base, i, gc[0]);
      finish(yc[0], gc[0]);
      storePack<T, V>(gx + base, i, gc[0]);
    }
  }
}

// ---- LayerNorm / RMSNorm forward
// ----------------------------------------------------------------------------------

// W: the parameters' storage type (T, or float for fp32 masters with 16-bit x). With res, the rows normalised
// are x + res rounded to T, also written to sum (a fused residual add).
template <class T, class W, int V, int P>
__global__ void __launch_bounds__(512)
    normKernel(const T* __restrict__ xIn, const T* __restrict__ res, T* __restrict__ sum,
               const W* __restrict__ w, const W* __restrict__ b, T* __restrict__ y,
               float* __restrict__ meanOut, float* __restrict__ rstdOut, int64_t C, float eps, bool rms) {
  __shared__ float scratch[32];
  int64_t base = int64_t(blockIdx.x) * C;
  int64_t packs = C / V;
  constexpr int R = P > 0 ? P : 1;
  float v[R][V];
  const T* x = xIn;
  if (res) {
    // Each thread writes and later re-reads only its own packs, so no barrier is needed when streaming.
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
      float a[V], r[V];
      loadPack<T, V>(xIn + base, i, a);
      loadPack<T, V>(res + base, i, r);
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = float(toAcc(fromAcc<T>(a[j] + r[j])));
      storePack<T, V>(sum + base, i, a);
    }
    x = sum;
  }
  // Pass 1: mean (LayerNorm only).
  float mean = 0.0f;
  auto forEachPack = [&](auto&& body) {
    if constexpr (P > 0) {
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (packIndex(p) < packs) body(packIndex(p), v[p]);
    } else {
      for (int64_t i = threadIdx.x; i < packs; i += blockDim.x) {
        loadPack<T, V>(x + base, i, v[0]);
        body(i, v[0]);
      }
    }
  };
  if constexpr (P > 0) {
#pragma unroll
    for (int p = 0; p < P; ++p)
      if (packIndex(p) < packs) loadPack<T, V>(x + base, packIndex(p), v[p]);
  }
  if (!rms) {
    float s = 0.0f;
    forEachPack([&](int64_t, float(&pv)[V]) {
#pragma unroll
      for (int j = 0; j < V; ++j) s += pv[j];
    });
    mean = blockSum(s, scratch) / float(C);
  }
  float sq = 0.0f;
  forEachPack([&](int64_t, float(&pv)[V]) {
#pragma unroll
    for (int j = 0; j < V; ++j) sq += (pv[j] - mean) * (pv[j] - mean);
  });
  float rstd = rsqrtf(blockSum(sq, scratch) / float(C) + eps);
  if (threadIdx.x == 0) {
    if (meanOut) meanOut[blockIdx.x] = mean;
    rstdOut[blockIdx.x] = rstd;
  }
  forEachPack([&](int64_t i, float(&pv)[V]) {
    float wv[V], bv[V];
    if (w) loadPack<W, V>(w, i, wv);
    if (b) loadPack<W, V>(b, i, bv);
    float o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      o[j] = (pv[j] - mean) * rstd;
      if (w) o[j] *= wv[j];
      if (b) o[j] += bv[j];
    }
    storePack<T, V>(y + base, i, o);
  });
}

// ---- LayerNorm / RMSNorm backward
// ---------------------------------------------------------------------------------

// gextra (optional) is added to gx: the gradient reaching the norm's input through a residual.
template <class T, class W, int V, int P, bool PARAMS>
__global__ void __launch_bounds__(512)
    normBackwardKernel(const T* __restrict__ gy, const T* __restrict__ x, const W* __restrict__ w,
                       const float* __restrict__ meanIn, const float* __restrict__ rstdIn,
                       const T* __restrict__ gextra, T* __restrict__ gx, float* __restrict__ gwPartial,
                       float* __restrict__ gbPartial, int64_t N, int64_t C, bool rms) {
  static_assert(P > 0, "the backward keeps its rows and parameter partials in registers");
  __shared__ float scratch[64];
  int64_t packs = C / V;
  float accW[P][V], accB[P][V];
  if (PARAMS) {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int j = 0; j < V; ++j) accW[p][j] = accB[p][j] = 0.0f;
  }
  float invC = 1.0f / float(C);
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    int64_t base = n * C;
    float mean = meanIn ? meanIn[n] : 0.0f, rstd = rstdIn[n];
    float g[P][V], xh[P][V];
    float sumG = 0.0f, sumGX = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) >= packs) continue;
      float wv[V];
      loadPack<T, V>(gy + base, packIndex(p), g[p]);
      loadPack<T, V>(x + base, packIndex(p), xh[p]);
      if (w) loadPack<W, V>(w, packIndex(p), wv);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        xh[p][j] = (xh[p][j] - mean) * rstd;
        if (PARAMS) {
          accW[p][j] += g[p][j] * xh[p][j];
          accB[p][j] += g[p][j];
        }
        if (w) g[p][j] *= wv[j];
        sumG += g[p][j];
        sumGX += g[p][j] * xh[p][j];
      }
    }
    float2 sums = blockSum2(make_float2(sumG, sumGX), scratch);
    sumG = sums.x;
    sumGX = sums.y;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) >= packs) continue;
#pragma unroll
      for (int j = 0; j < V; ++j)
        g[p][j] = rms ? rstd * (g[p][j] - xh[p][j] * sumGX * invC)
                      : rstd * (g[p][j] - (sumG + xh[p][j] * sumGX) * invC);
      if (gextra) {
        float e[V];
        loadPack<T, V>(gextra + base, packIndex(p), e);
#pragma unroll
        for (int j = 0; j < V; ++j) g[p][j] += e[j];
      }
      storePack<T, V>(gx + base, packIndex(p), g[p]);
    }
  }
  if (PARAMS) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (packIndex(p) >= packs) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        int64_t c = packIndex(p) * V + j;
        if (gwPartial) gwPartial[int64_t(blockIdx.x) * C + c] = accW[p][j];
        if (gbPartial) gbPartial[int64_t(blockIdx.x) * C + c] = accB[p][j];
      }
    }
  }
}

}  // namespace strata::kernels
