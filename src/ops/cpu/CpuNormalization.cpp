// CPU softmax / log-softmax and LayerNorm / RMSNorm over rows, forward and backward.
#include <cmath>
#include <limits>

#include "CpuKernels.h"

namespace strata::ops::cpu {
namespace {

void softmax(const Tensor& x, const Tensor& y, bool log, const SoftmaxOptions& o) {
  int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  visitFloating(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* in = static_cast<const T*>(x.data());
    T* out = static_cast<T*>(y.data());
#pragma omp parallel for if (N * C > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = in + n * C;
      T* orow = out + n * C;
      // Columns at or past `visible` are masked (causal); the rest are scaled.
      int64_t visible = o.causalRows > 0 ? std::min<int64_t>(C, n % o.causalRows + o.causalShift + 1) : C;
      const F scale = F(o.scale);
      F mx = -std::numeric_limits<F>::infinity();
      for (int64_t c = 0; c < visible; ++c) mx = std::max(mx, scale * F(row[c]));
      F sum = 0;
      for (int64_t c = 0; c < visible; ++c) sum += std::exp(scale * F(row[c]) - mx);
      if (log) {
        F lse = mx + std::log(sum);
        for (int64_t c = 0; c < C; ++c)
          orow[c] = c < visible ? T(scale * F(row[c]) - lse) : T(-std::numeric_limits<F>::infinity());
      } else {
        F inv = F(1) / sum;
        for (int64_t c = 0; c < C; ++c)
          orow[c] = c < visible ? T(std::exp(scale * F(row[c]) - mx) * inv) : T(F(0));
      }
    }
  });
}

void softmaxBackward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log, double scale) {
  int64_t C = y.size(-1), N = y.numel() / std::max<int64_t>(C, 1);
  visitFloating(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* yp = static_cast<const T*>(y.data());
    const T* gp = static_cast<const T*>(gy.data());
    T* op = static_cast<T*>(gx.data());
#pragma omp parallel for if (N * C > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* yr = yp + n * C;
      const T* gr = gp + n * C;
      T* orow = op + n * C;
      F dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += log ? F(gr[c]) : F(gr[c]) * F(yr[c]);
      const F s = F(scale);
      for (int64_t c = 0; c < C; ++c)
        orow[c] = log ? T(s * (F(gr[c]) - std::exp(F(yr[c])) * dot)) : T(s * F(yr[c]) * (F(gr[c]) - dot));
    }
  });
}

// A norm parameter read in the compute type F, stored as T (x's dtype) or as F itself (fp32 masters).
template <class T, class F>
struct ParamReader {
  const T* t = nullptr;
  const F* f = nullptr;
  explicit ParamReader(const Tensor& p, DType xDtype) {
    if (!p.defined()) return;
    if (p.dtype() == xDtype)
      t = static_cast<const T*>(p.data());
    else
      f = static_cast<const F*>(p.data());
  }
  explicit operator bool() const { return t || f; }
  F operator[](int64_t c) const { return t ? F(t[c]) : f[c]; }
};

void norm(const Tensor& x, const Tensor& residual, const Tensor& sum, const Tensor& weight,
          const Tensor& bias, const Tensor& y, const Tensor& mean, const Tensor& rstd, double eps, bool rms) {
  int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  visitFloating(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* in = static_cast<const T*>(x.data());
    const T* res = residual.defined() ? static_cast<const T*>(residual.data()) : nullptr;
    T* sumP = sum.defined() ? static_cast<T*>(sum.data()) : nullptr;
    ParamReader<T, F> w(weight, x.dtype()), b(bias, x.dtype());
    T* out = static_cast<T*>(y.data());
    using S = F;  // fp32 statistics, f64 for f64 inputs
    S* meanP = mean.defined() ? static_cast<S*>(mean.data()) : nullptr;
    S* rstdP = static_cast<S*>(rstd.data());
#pragma omp parallel for if (N * C > kParallelGrain)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = in + n * C;
      if (res) {
        for (int64_t c = 0; c < C; ++c) sumP[n * C + c] = T(F(row[c]) + F(res[n * C + c]));
        row = sumP + n * C;
      }
      F mu = 0;
      if (!rms) {
        for (int64_t c = 0; c < C; ++c) mu += F(row[c]);
        mu /= F(C);
      }
      F var = 0;
      for (int64_t c = 0; c < C; ++c) {
        F d = F(row[c]) - mu;
        var += d * d;
      }
      var /= F(C);
      F rs = F(1) / std::sqrt(var + F(eps));
      if (meanP) meanP[n] = S(mu);
      rstdP[n] = S(rs);
      for (int64_t c = 0; c < C; ++c) {
        F v = (F(row[c]) - mu) * rs;
        if (w) v *= w[c];
        if (b) v += b[c];
        out[n * C + c] = T(v);
      }
    }
  });
}

void normBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                  const Tensor& rstd, const Tensor& gextra, const Tensor& gx, const Tensor& gw,
                  const Tensor& gb, bool rms) {
  int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  visitFloating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    const T* g = static_cast<const T*>(gy.data());
    const T* in = static_cast<const T*>(x.data());
    const T* extra = gextra.defined() ? static_cast<const T*>(gextra.data()) : nullptr;
    ParamReader<T, F> w(weight, x.dtype());
    // Statistics and weight/bias gradients are fp32, or f64 for f64 inputs (gradient checks).
    using S = F;
    const S* meanP = mean.defined() ? static_cast<const S*>(mean.data()) : nullptr;
    const S* rstdP = static_cast<const S*>(rstd.data());
    auto stats = [&](int64_t n, F& mu, F& rs) {
      mu = meanP ? F(meanP[n]) : F(0);
      rs = F(rstdP[n]);
    };
    if (gx.defined()) {
      T* out = static_cast<T*>(gx.data());
#pragma omp parallel for if (N * C > kParallelGrain)
      for (int64_t n = 0; n < N; ++n) {
        F mu, rs;
        stats(n, mu, rs);
        const T* row = in + n * C;
        const T* grow = g + n * C;
        F sumG = 0, sumGX = 0;
        for (int64_t c = 0; c < C; ++c) {
          F gw_ = F(grow[c]) * (w ? w[c] : F(1));
          F xhat = (F(row[c]) - mu) * rs;
          sumG += gw_;
          sumGX += gw_ * xhat;
        }
        for (int64_t c = 0; c < C; ++c) {
          F gw_ = F(grow[c]) * (w ? w[c] : F(1));
          F xhat = (F(row[c]) - mu) * rs;
          F v = rms ? rs * (gw_ - xhat * sumGX / F(C)) : rs * (gw_ - (sumG + xhat * sumGX) / F(C));
          if (extra) v += F(extra[n * C + c]);
          out[n * C + c] = T(v);
        }
      }
    }
    if (gw.defined() || gb.defined()) {
      S* gwP = gw.defined() ? static_cast<S*>(gw.data()) : nullptr;
      S* gbP = gb.defined() ? static_cast<S*>(gb.data()) : nullptr;
#pragma omp parallel for if (N * C > kParallelGrain)
      for (int64_t c = 0; c < C; ++c) {
        F accW = 0, accB = 0;
        for (int64_t n = 0; n < N; ++n) {
          F mu, rs;
          stats(n, mu, rs);
          F gv = F(g[n * C + c]);
          accW += gv * (F(in[n * C + c]) - mu) * rs;
          accB += gv;
        }
        if (gwP) gwP[c] = S(accW);
        if (gbP) gbP[c] = S(accB);
      }
    }
  });
}

}  // namespace

void registerNormalization(Registry& r) {
  r.add<SoftmaxKernel>("softmax", DeviceType::CPU, &softmax);
  r.add<SoftmaxBackwardKernel>("softmax_backward", DeviceType::CPU, &softmaxBackward);
  r.add<NormKernel>("norm", DeviceType::CPU, &norm);
  r.add<NormBackwardKernel>("norm_backward", DeviceType::CPU, &normBackward);
}

}  // namespace strata::ops::cpu
