// CPU embedding gather/scatter-add and cross-entropy over rows.
#include <cmath>
#include <cstring>
#include <limits>

#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  int64_t V = weight.size(0), C = weight.size(1), N = indices.numel();
  size_t rowBytes = size_t(C) * dtypeSize(weight.dtype());
  const char* w = static_cast<const char*>(weight.data());
  char* o = static_cast<char*>(out.data());
  visitIndexType(indices.dtype(), [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* idx = static_cast<const I*>(indices.data());
    for (int64_t n = 0; n < N; ++n) {
      int64_t i = int64_t(idx[n]);
      STRATA_CHECK(i >= 0 && i < V, "embedding: index {} out of range [0, {})", i, V);
      std::memcpy(o + size_t(n) * rowBytes, w + size_t(i) * rowBytes, rowBytes);
    }
  });
}

void embeddingBackward(const Tensor& gy, const Tensor& indices, const Tensor& gw) {
  int64_t V = gw.size(0), C = gw.size(1), N = indices.numel();
  visitFloating(gy.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* g = static_cast<const T*>(gy.data());
    F* out = static_cast<F*>(gw.data());
    visitIndexType(indices.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      const I* idx = static_cast<const I*>(indices.data());
      for (int64_t n = 0; n < N; ++n) {
        int64_t i = int64_t(idx[n]);
        STRATA_CHECK(i >= 0 && i < V, "embedding: index {} out of range [0, {})", i, V);
        for (int64_t c = 0; c < C; ++c) out[i * C + c] += F(g[n * C + c]);
      }
    });
  });
}

// One row's log-sum-exp (max first), its loss against target tn and its counted flag, as both CPU
// cross-entropy kernels compute them.
template <class F, class T>
F rowLoss(const T* row, int64_t V, int64_t tn, int64_t ignoreIndex, F& loss, F& valid) {
  F mx = -std::numeric_limits<F>::infinity();
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, F(row[v]));
  F sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(F(row[v]) - mx);
  F l = mx + std::log(sum);
  bool ok = tn != ignoreIndex;
  valid = ok ? F(1) : F(0);
  loss = ok && tn >= 0 && tn < V ? l - F(row[tn]) : F(0);
  return l;
}

void crossEntropy(const Tensor& logits, const Tensor& target, const Tensor& loss, const Tensor& lse,
                  const Tensor& valid, int64_t ignoreIndex) {
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* x = static_cast<const T*>(logits.data());
    F* lossP = static_cast<F*>(loss.data());
    F* lseP = static_cast<F*>(lse.data());
    F* validP = static_cast<F*>(valid.data());
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      const I* t = static_cast<const I*>(target.data());
#pragma omp parallel for if (N * V > kParallelGrain)
      for (int64_t n = 0; n < N; ++n) {
        lseP[n] = rowLoss<F>(x + n * V, V, int64_t(t[n]), ignoreIndex, lossP[n], validP[n]);
      }
    });
  });
}

void crossEntropyBackward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& scale,
                          const Tensor& glogits, int64_t ignoreIndex) {
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* x = static_cast<const T*>(logits.data());
    const F* lseP = static_cast<const F*>(lse.data());
    F s = static_cast<const F*>(scale.data())[0];
    T* g = static_cast<T*>(glogits.data());
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      const I* t = static_cast<const I*>(target.data());
#pragma omp parallel for if (N * V > kParallelGrain)
      for (int64_t n = 0; n < N; ++n) {
        int64_t tn = int64_t(t[n]);
        bool ok = tn != ignoreIndex;
        for (int64_t v = 0; v < V; ++v) {
          F p = std::exp(F(x[n * V + v]) - lseP[n]);
          g[n * V + v] = ok ? T((p - (v == tn ? F(1) : F(0))) * s) : T(F(0));
        }
      }
    });
  });
}

// The same arithmetic as crossEntropy followed by crossEntropyBackward with scale 1, in one pass per row.
void crossEntropyInPlace(const Tensor& logits, const Tensor& target, const Tensor& loss, const Tensor& valid,
                         bool grad, int64_t ignoreIndex) {
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloating(logits.dtype(), "cross_entropy_in_place", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    T* x = static_cast<T*>(logits.data());
    F* lossP = static_cast<F*>(loss.data());
    F* validP = static_cast<F*>(valid.data());
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      const I* t = static_cast<const I*>(target.data());
#pragma omp parallel for if (N * V > kParallelGrain)
      for (int64_t n = 0; n < N; ++n) {
        T* row = x + n * V;
        int64_t tn = int64_t(t[n]);
        bool ok = tn != ignoreIndex;
        F l = rowLoss<F>(row, V, tn, ignoreIndex, lossP[n], validP[n]);
        if (!grad) continue;
        for (int64_t v = 0; v < V; ++v) {
          F p = std::exp(F(row[v]) - l);
          row[v] = ok ? T(p - (v == tn ? F(1) : F(0))) : T(F(0));
        }
      }
    });
  });
}

}  // namespace

void registerNn(Registry& r) {
  r.add<EmbeddingKernel>("embedding", DeviceType::CPU, &embedding);
  r.add<EmbeddingBackwardKernel>("embedding_backward", DeviceType::CPU, &embeddingBackward);
  r.add<CrossEntropyKernel>("cross_entropy", DeviceType::CPU, &crossEntropy);
  r.add<CrossEntropyBackwardKernel>("cross_entropy_backward", DeviceType::CPU, &crossEntropyBackward);
  r.add<CrossEntropyInPlaceKernel>("cross_entropy_in_place", DeviceType::CPU, &crossEntropyInPlace);
}

}  // namespace strata::ops::cpu
