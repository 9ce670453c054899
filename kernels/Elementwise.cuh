// Elementwise kernels: map (any functor of ElementwiseFunctors.h over N inputs), copy with dtype conversion,
// fill, arange, Philox random, dropout, and a spin that holds a stream (a test aid).
//
// Layout: map and copy have a contiguous path (16-byte packs when every pointer is aligned, one element per
// thread otherwise) and a strided path that decomposes a linear index over the coalesced dims
// (ops/Strided.h). Parallelisation: a grid-stride loop over packs or elements; the launchers size the grid to
// the work.
#pragma once

#include <utility>

#include "kernels/Common.cuh"
#include "src/ops/Strided.h"
#include "strata/core/Philox.h"

namespace strata::kernels {

template <class T, int N>
struct InputPtrs {
  const T* p[N];
};

template <class F, class A, size_t... I>
__device__ __forceinline__ A applyFunctor(const F& f, const A* vals, std::index_sequence<I...>) {
  return f(vals[I]...);
}

// ---- map
// ----------------------------------------------------------------------------------------------------------

// f over V lanes of N loaded packs, in the accumulate type, rounded once on the way out.
template <class F, class T, int N, int V>
__device__ __forceinline__ Vec<T, V> applyPack(const F& f, const Vec<T, V> (&loaded)[N]) {
  using A = decltype(toAcc(T{}));
  Vec<T, V> result;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    A vals[N];
#pragma unroll
    for (int k = 0; k < N; ++k) vals[k] = toAcc(loaded[k].v[j]);
    result.v[j] = fromAcc<T>(applyFunctor(f, vals, std::make_index_sequence<N>{}));
  }
  return result;
}

template <class F, class T, int N, int V>
__global__ void mapPackedKernel(T* __restrict__ out, InputPtrs<T, N> in, int64_t n, F f) {
  using A = decltype(toAcc(T{}));
  int64_t packs = n / V;
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < packs; i += stride) {
    Vec<T, V> loaded[N];
#pragma unroll
    for (int k = 0; k < N; ++k) loaded[k] = reinterpret_cast<const Vec<T, V>*>(in.p[k])[i];
    reinterpret_cast<Vec<T, V>*>(out)[i] = applyPack<F, T, N, V>(f, loaded);
  }
  // The tail that does not fill a pack.
  int64_t t = packs * V + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < n && blockIdx.x == 0) {
    A vals[N];
#pragma unroll
    for (int k = 0; k < N; ++k) vals[k] = toAcc(in.p[k][t]);
    out[t] = fromAcc<T>(applyFunctor(f, vals, std::make_index_sequence<N>{}));
  }
}

// Strided operands (broadcasts, transposes). V > 1: the layout is in packs of V elements along a contiguous
// innermost dim (StridedLayout::packInner), so a bias broadcast or a head permute still moves 16 bytes per
// access. I: index type (uint32_t when the layout fits).
template <class F, class T, int N, int V, class I>
__global__ void mapStridedKernel(T* __restrict__ out, InputPtrs<T, N> in, I n,
                                 ops::StridedLayout<N + 1> layout, F f) {
  I stride = I(gridDim.x) * blockDim.x;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I off[N + 1];
    layout.offsets(i, off);
    Vec<T, V> loaded[N];
#pragma unroll
    for (int k = 0; k < N; ++k) loaded[k] = reinterpret_cast<const Vec<T, V>*>(in.p[k])[off[k + 1]];
    reinterpret_cast<Vec<T, V>*>(out)[off[0]] = applyPack<F, T, N, V>(f, loaded);
  }
}

// ---- copy, fill, arange, random, dropout
// --------------------------------------------------------------------------

// Same-dtype strided copies with a contiguous innermost dim go through copyPackedStridedKernel (16-byte
// packs); the rest one element at a time. I: index type.
template <class T, int V, class I>
__global__ void copyPackedStridedKernel(T* __restrict__ dst, const T* __restrict__ src, I n,
                                        ops::StridedLayout<2> layout) {
  I stride = I(gridDim.x) * blockDim.x;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I off[2];
    layout.offsets(i, off);
    reinterpret_cast<Vec<T, V>*>(dst)[off[0]] = reinterpret_cast<const Vec<T, V>*>(src)[off[1]];
  }
}

template <class D, class S, class I>
__global__ void copyStridedKernel(D* __restrict__ dst, const S* __restrict__ src, I n,
                                  ops::StridedLayout<2> layout) {
  I stride = I(gridDim.x) * blockDim.x;
  for (I i = I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    I off[2];
    layout.offsets(i, off);
    if constexpr (std::is_same_v<D, S>) {
      dst[off[0]] = src[off[1]];
    } else {
      dst[off[0]] = fromDouble<D>(toDouble(src[off[1]]));
    }
  }
}

template <class D, class S>
__global__ void convertContiguousKernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = fromDouble<D>(toDouble(src[i]));
  }
}

template <class T>
__global__ void fillKernel(T* __restrict__ out, int64_t n, T value) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = value;
}

template <class T>
__global__ void arangeKernel(T* __restrict__ out, int64_t n, double start, double step) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = fromDouble<T>(start + double(i) * step);
}

template <class T>
__global__ void randomKernel(T* __restrict__ out, int64_t n, uint64_t seed, uint64_t offset, bool normal,
                             float a, float b) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t idx = offset + uint64_t(i);
    // Same expression as the CPU kernel, so uniform draws are bit-identical.
    float v = normal ? a + b * philoxNormal(seed, idx) : a + (b - a) * philoxUniform(seed, idx);
    out[i] = fromAcc<T>(AccT<T>(v));
  }
}

// One thread that returns once the global timer has advanced `nanoseconds` past its start: the stream it
// runs on is held that long (a test aid, ops::spin).
__global__ void spinKernel(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// ----------------------------------------------------------------------------------------------------------

// One thread per group of 8 counters (NOTE [Dropout bits]): one Philox evaluation gives the group's 8 keep
// bits. `groups` counts the groups from offset / 8 to (offset + n - 1) / 8; the first and last may be
// partial.
template <class T>
__global__ void dropoutKernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, int64_t groups,
                              uint32_t threshold, AccT<T> scale, uint64_t seed, uint64_t offset) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint64_t first = offset >> 3;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    uint32_t bits = dropKeepByte(seed, first + uint64_t(g), threshold);
    int64_t i0 = int64_t((first + uint64_t(g)) * 8 - offset);
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      int64_t i = i0 + l;
      if (i < 0 || i >= n) continue;
      out[i] = (bits >> l) & 1u ? fromAcc<T>(toAcc(in[i]) * scale) : fromAcc<T>(AccT<T>(0));
    }
  }
}

}  // namespace strata::kernels
