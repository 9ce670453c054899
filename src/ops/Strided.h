// Strided iteration shared by the backends: operands of one shape with their own strides, dims coalesced
// where every operand is contiguous across them, so most calls end up 1-D or 2-D.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "strata/core/Philox.h"  // STRATA_HOST_DEVICE
#include "strata/core/Tensor.h"

namespace strata::ops {

constexpr int kMaxDims = 10;

template <int N>
struct StridedLayout {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // in elements

  // Element offsets of linear index `i` (row-major over sizes) for every operand.
  // I: the index type; 32-bit division is several times cheaper on the GPU, so launchers pick uint32_t when
  // every index and offset fits (fitsIn32()).
  template <class I = int64_t>
  STRATA_HOST_DEVICE void offsets(I i, I (&out)[N]) const {
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      I size = I(sizes[d]);
      I idx = i % size;
      i /= size;
      for (int k = 0; k < N; ++k) out[k] += idx * I(strides[k][d]);
    }
  }

  // True when linear indices below n and every operand's offsets fit in 31 bits (strides are non-negative).
  bool fitsIn32(int64_t n) const {
    if (n >= (int64_t(1) << 31)) return false;
    for (int k = 0; k < N; ++k) {
      int64_t maxOffset = 0;
      for (int d = 0; d < ndim; ++d) {
        if (strides[k][d] < 0) return false;
        maxOffset += (sizes[d] - 1) * strides[k][d];
      }
      if (maxOffset >= (int64_t(1) << 31)) return false;
    }
    return true;
  }

  // Rewrites the layout in units of packs of `v` elements along the innermost dim, when every operand is
  // contiguous there, the dim splits into whole packs and every other stride is a multiple of v. Broadcast
  // operands (stride 0 in outer dims) are fine. Returns false (layout unchanged) otherwise.
  bool packInner(int v) {
    if (ndim == 0 || sizes[ndim - 1] % v != 0) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[k][ndim - 1] != 1) return false;
      for (int d = 0; d < ndim - 1; ++d)
        if (strides[k][d] % v != 0) return false;
    }
    sizes[ndim - 1] /= v;
    for (int k = 0; k < N; ++k)
      for (int d = 0; d < ndim - 1; ++d) strides[k][d] /= v;
    return true;
  }
};

// Operands: tensors of the same shape. Throws when more than kMaxDims dims remain after coalescing.
template <int N>
StridedLayout<N> makeLayout(const std::array<const Tensor*, N>& operands) {
  const Shape& shape = operands[0]->shape();
  std::vector<int64_t> sizes;
  std::vector<std::array<int64_t, N>> strides;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    std::array<int64_t, N> st{};
    for (int k = 0; k < N; ++k) st[k] = operands[k]->strides()[d];
    if (!sizes.empty()) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && strides.back()[k] == st[k] * shape[d];
      if (merge) {
        sizes.back() *= shape[d];
        strides.back() = st;
        continue;
      }
    }
    sizes.push_back(shape[d]);
    strides.push_back(st);
  }
  STRATA_CHECK(sizes.size() <= size_t(kMaxDims), "tensor iteration over {} non-mergeable dims (at most {})",
               sizes.size(), kMaxDims);
  StridedLayout<N> layout;
  layout.ndim = int(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    layout.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) layout.strides[k][d] = strides[d][k];
  }
  return layout;
}

// Host iteration over linear indices [begin, end): calls fn(offsets) with each element's offsets, walking the
// innermost dim by adding strides (no division per element) and carrying into outer dims like an odometer.
template <int N, class Fn>
void forEachOffset(const StridedLayout<N>& layout, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  int64_t off[N];
  if (layout.ndim == 0) {
    for (int k = 0; k < N; ++k) off[k] = 0;
    fn(off);
    return;
  }
  int nd = layout.ndim;
  int64_t idx[kMaxDims];
  int64_t rest = begin;
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rest % layout.sizes[d];
    rest /= layout.sizes[d];
    for (int k = 0; k < N; ++k) off[k] += idx[d] * layout.strides[k][d];
  }
  int inner = nd - 1;
  int64_t innerSize = layout.sizes[inner];
  int64_t innerStride[N];
  for (int k = 0; k < N; ++k) innerStride[k] = layout.strides[k][inner];
  int64_t i = begin;
  while (i < end) {
    int64_t run = std::min(end - i, innerSize - idx[inner]);
    for (int64_t j = 0; j < run; ++j) {
      fn(off);
      for (int k = 0; k < N; ++k) off[k] += innerStride[k];
    }
    i += run;
    if (i >= end) break;
    // Carry: the inner dim wrapped.
    for (int k = 0; k < N; ++k) off[k] -= innerStride[k] * innerSize;
    idx[inner] = 0;
    for (int d = inner - 1; d >= 0; --d) {
      for (int k = 0; k < N; ++k) off[k] += layout.strides[k][d];
      if (++idx[d] < layout.sizes[d]) break;
      for (int k = 0; k < N; ++k) off[k] -= layout.strides[k][d] * layout.sizes[d];
      idx[d] = 0;
    }
  }
}

inline bool allContiguousSameShape(const Tensor& out, const std::vector<Tensor>& inputs) {
  if (!out.isContiguous()) return false;
  for (const auto& t : inputs)
    if (!t.isContiguous() || t.shape() != out.shape()) return false;
  return true;
}

}  // namespace strata::ops
