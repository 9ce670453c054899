// Embedding gather / scatter-add and cross-entropy over rows of logits.
//
// - embeddingKernel: one block per output row copies one weight row.
// - embeddingBackward: deterministic. embeddingKeysKernel writes each input row's id (ids out of range become
//   V) and position; a stable radix sort (cub) groups the positions by id, in order;
//   embeddingBackwardSortedKernel runs one block per sorted position, and the block at the start of each id's
//   run adds the run's gradient rows to that id's fp32 gradient row one after another, in input order. No
//   atomics: the same bits on every run (which ZeRO's stage-for-stage and resume checks compare), and the CPU
//   kernel's order.
// - crossEntropyKernel: one block per row, online max/sum (one read of the row), writes loss, log-sum-exp and
//   a valid flag. The backward recomputes softmax from the logits and the saved log-sum-exp, so no
//   probability tensor outlives the forward.
// - crossEntropyInPlaceKernel: both at once for the fused LM head. One block per row reads the row in 16-byte
//   packs for the max and sum (one rescale per pack), then reads it again (mostly from L2) and overwrites it
//   with softmax - one_hot: two reads and one write of the logits, against three reads and one write for the
//   pair above.
#pragma once

#include "kernels/Common.cuh"

namespace strata::kernels {

template <class T, class I>
__global__ void embeddingKernel(const T* __restrict__ weight, const I* __restrict__ idx, T* __restrict__ out,
                                int64_t C, int64_t V, int* __restrict__ bad) {
  int64_t n = blockIdx.x;
  int64_t row = int64_t(idx[n]);
  if (row < 0 || row >= V) {
    if (threadIdx.x == 0 && bad) atomicExch(bad, 1);
    return;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out[n * C + c] = weight[row * C + c];
}

template <class I>
__global__ void embeddingKeysKernel(const I* __restrict__ idx, int64_t N, int64_t V, int* __restrict__ keys,
                                    int* __restrict__ positions) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride) {
    int64_t row = int64_t(idx[n]);
    keys[n] = row < 0 || row >= V ? int(V) : int(row);
    positions[n] = int(n);
  }
}

template <class T>
__global__ void embeddingBackwardSortedKernel(const T* __restrict__ gy, const int* __restrict__ rows,
                                              const int* __restrict__ positions, float* __restrict__ gw,
                                              int64_t N, int64_t C, int64_t V) {
  int64_t s = blockIdx.x;
  int row = rows[s];
  if (row >= V || (s > 0 && rows[s - 1] == row)) return;
  int64_t end = s + 1;
  while (end < N && rows[end] == row) ++end;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = gw[int64_t(row) * C + c];
    for (int64_t j = s; j < end; ++j) acc += float(toAcc(gy[int64_t(positions[j]) * C + c]));
    gw[int64_t(row) * C + c] = acc;
  }
}

template <class T, class I>
__global__ void crossEntropyKernel(const T* __restrict__ logits, const I* __restrict__ target,
                                   float* __restrict__ loss, float* __restrict__ lse,
                                   float* __restrict__ valid, int64_t V, int64_t ignoreIndex) {
  __shared__ float sm[32], ss[32];
  const T* row = logits + int64_t(blockIdx.x) * V;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) st = combine(st, MaxSum{float(toAcc(row[v])), 1.0f});
  st = blockMaxSum(st, sm, ss);
  if (threadIdx.x == 0) {
    float l = st.m + logf(st.s);
    int64_t t = int64_t(target[blockIdx.x]);
    bool ok = t != ignoreIndex;
    lse[blockIdx.x] = l;
    valid[blockIdx.x] = ok ? 1.0f : 0.0f;
    loss[blockIdx.x] = ok && t >= 0 && t < V ? l - float(toAcc(row[t])) : 0.0f;
  }
}

template <class T, class I>
__global__ void crossEntropyBackwardKernel(const T* __restrict__ logits, const I* __restrict__ target,
                                           const float* __restrict__ lse, const float* __restrict__ scale,
                                           T* __restrict__ glogits, int64_t V, int64_t ignoreIndex) {
  int64_t n = blockIdx.x;
  const T* row = logits + n * V;
  T* out = glogits + n * V;
  int64_t t = int64_t(target[n]);
  bool ok = t != ignoreIndex;
  float l = lse[n], s = scale[0];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float p = expf(float(toAcc(row[v])) - l);
    out[v] = fromAcc<T>(ok ? (p - (v == t ? 1.0f : 0.0f)) * s : 0.0f);
  }
}

// P: elements per pack (kVec<T> when the rows are 16-byte aligned, else 1).
template <class T, class I, int P>
__global__ void crossEntropyInPlaceKernel(T* __restrict__ logits, const I* __restrict__ target,
                                          float* __restrict__ loss, float* __restrict__ valid, int64_t V,
                                          bool grad, int64_t ignoreIndex) {
  __shared__ float sm[32], ss[32];
  int64_t n = blockIdx.x;
  T* row = logits + n * V;
  int64_t t = int64_t(target[n]);
  bool ok = t != ignoreIndex, hit = ok && t >= 0 && t < V;
  float xt = hit ? float(toAcc(row[t])) : 0.0f;  // read before any thread overwrites the row
  using Pack = Vec<T, P>;
  Pack* packs = reinterpret_cast<Pack*>(row);
  int64_t count = V / P;
  MaxSum st{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    Pack x = packs[i];
    float f[P], m = -INFINITY, s = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      f[k] = float(toAcc(x.v[k]));
      m = fmaxf(m, f[k]);
    }
    if (m != -INFINITY) {
#pragma unroll
      for (int k = 0; k < P; ++k) s += __expf(f[k] - m);
    }
    st = combine(st, MaxSum{m, s});
  }
  for (int64_t v = count * P + threadIdx.x; v < V; v += blockDim.x)
    st = combine(st, MaxSum{float(toAcc(row[v])), 1.0f});
  st = blockMaxSum(st, sm, ss);  // its barriers also order the read of row[t] before the writes below
  float l = st.m + logf(st.s);
  if (threadIdx.x == 0) {
    loss[n] = hit ? l - xt : 0.0f;
    valid[n] = ok ? 1.0f : 0.0f;
  }
  if (!grad) return;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    Pack x = packs[i];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      int64_t v = i * P + k;
      float p = __expf(float(toAcc(x.v[k])) - l) - (v == t ? 1.0f : 0.0f);
      x.v[k] = fromAcc<T>(ok ? p : 0.0f);
    }
    packs[i] = x;
  }
  for (int64_t v = count * P + threadIdx.x; v < V; v += blockDim.x) {
    float p = __expf(float(toAcc(row[v])) - l) - (v == t ? 1.0f : 0.0f);
    row[v] = fromAcc<T>(ok ? p : 0.0f);
  }
}

}  // namespace strata::kernels
