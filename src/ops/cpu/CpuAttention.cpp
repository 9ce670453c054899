// CPU reference for fused attention: the same math as the CUDA kernels (log2-domain row statistics, P
// recomputed in the backward, the dropout mask of NOTE [Fused attention dropout] replayed, the additive bias
// of NOTE [Biased fused attention] in kernels/FlashAttention.cuh), one (batch, head) per OpenMP task.
// Strided operands are read in place.
#include <cmath>
#include <limits>
#include <vector>

#include "CpuKernels.h"
#include "strata/core/Philox.h"

namespace strata::ops::cpu {
namespace {

constexpr double kLog2e = 1.4426950408889634;

template <class T>
struct View {
  T* data;
  int64_t b, s, h;
  T* row(int64_t bi, int64_t hi, int64_t si) const { return data + bi * b + hi * h + si * s; }
};
template <class T>
View<T> viewOf(const Tensor& t) {
  return View<T>{static_cast<T*>(t.data()), t.strides()[0], t.strides()[1], t.strides()[2]};
}

bool hidden(bool causal, int64_t i, int64_t j, int64_t shift) {
  return causal && j > i + shift;
}

// options.bias of (batch b, head h): its row i at row(i), or nothing.
template <class T>
struct BiasView {
  const T* data = nullptr;
  int64_t b = 0, h = 0, s = 0;
  explicit BiasView(const Tensor& bias) {
    if (!bias.defined()) return;
    data = static_cast<const T*>(bias.data());
    b = bias.size(0) == 1 ? 0 : bias.strides()[0];
    h = bias.strides()[1];
    s = bias.strides()[2];
  }
  template <class F>
  F at(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    return data == nullptr ? F(0) : F(data[bi * b + hi * h + i * s + j]);
  }
};

// NOTE [Fused attention dropout] in ops/Ops.h: the factor probability (b, h, i, j) is multiplied by, 0 or
// 1 / (1 - p), from the mask ops::dropout would draw over [B, H, Sq, Sk].
struct DropMask {
  const AttentionOptions& opt;
  int64_t H, Sq, Sk;
  double keepScale;
  uint32_t threshold;
  DropMask(const AttentionOptions& o, int64_t h, int64_t sq, int64_t sk)
      : opt(o),
        H(h),
        Sq(sq),
        Sk(sk),
        keepScale(o.dropout > 0 ? 1.0 / (1.0 - o.dropout) : 1.0),
        threshold(dropThreshold(o.dropout)) {}
  template <class F>
  F factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (opt.dropout <= 0) return F(1);
    uint64_t index = opt.offset + uint64_t(((b * H + h) * Sq + i) * Sk + j);
    return dropKeep(opt.seed, index, threshold) ? F(keepScale) : F(0);
  }
};

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse2,
             const AttentionOptions& opt) {
  int64_t B = q.size(0), Sq = q.size(1), H = q.size(2), D = q.size(3), Sk = k.size(1), shift = Sk - Sq;
  visitFloating(q.dtype(), "flash_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    auto Q = viewOf<T>(q), K = viewOf<T>(k), V = viewOf<T>(v), O = viewOf<T>(out);
    F* L = static_cast<F*>(lse2.data());  // F: fp32, or f64 for f64 inputs
    F scale = F(opt.scale);
    DropMask drop(opt, H, Sq, Sk);
    BiasView<T> bias(opt.bias);
#pragma omp parallel for collapse(2) if (B * H * Sq * Sk * D > kParallelGrain)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        std::vector<F> s(static_cast<size_t>(Sk)), acc(static_cast<size_t>(D));
        for (int64_t i = 0; i < Sq; ++i) {
          const T* qi = Q.row(b, h, i);
          F mx = -std::numeric_limits<F>::infinity();
          for (int64_t j = 0; j < Sk; ++j) {
            if (hidden(opt.causal, i, j, shift)) {
              s[size_t(j)] = -std::numeric_limits<F>::infinity();
              continue;
            }
            const T* kj = K.row(b, h, j);
            F dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += F(qi[d]) * F(kj[d]);
            s[size_t(j)] = dot * scale + bias.template at<F>(b, h, i, j);
            mx = std::max(mx, s[size_t(j)]);
          }
          F sum = 0;
          std::fill(acc.begin(), acc.end(), F(0));
          for (int64_t j = 0; j < Sk; ++j) {
            if (hidden(opt.causal, i, j, shift)) continue;
            F p = std::exp(s[size_t(j)] - mx);
            sum += p;  // the softmax's own sum: dropout comes after it
            p *= drop.template factor<F>(b, h, i, j);
            const T* vj = V.row(b, h, j);
            for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * F(vj[d]);
          }
          T* oi = O.row(b, h, i);
          for (int64_t d = 0; d < D; ++d) oi[d] = T(acc[size_t(d)] / sum);
          L[(b * H + h) * Sq + i] = F((double(mx) + std::log(double(sum))) * kLog2e);
        }
      }
    }
  });
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse2, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
              const AttentionOptions& opt) {
  int64_t B = q.size(0), Sq = q.size(1), H = q.size(2), D = q.size(3), Sk = k.size(1), shift = Sk - Sq;
  visitFloating(q.dtype(), "flash_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using F = typename ComputeOf<T>::type;
    auto Q = viewOf<T>(q), K = viewOf<T>(k), V = viewOf<T>(v), O = viewOf<T>(out), dO = viewOf<T>(dout);
    auto dQ = viewOf<T>(dq), dK = viewOf<T>(dk), dV = viewOf<T>(dv);
    const F* L = static_cast<const F*>(lse2.data());
    F scale = F(opt.scale);
    DropMask drop(opt, H, Sq, Sk);
    BiasView<T> bias(opt.bias);
    // The bias's gradient of each (batch, head), summed over the batch afterwards (in batch order) where the
    // bias is shared: tasks of different batches never write one element.
    bool sharedBias = dbias.defined() && dbias.size(0) == 1 && B > 1;
    std::vector<F> dbiasParts(sharedBias ? size_t(B * H * Sq * Sk) : 0);
    F* dbiasOut = dbias.defined() ? static_cast<F*>(dbias.data()) : nullptr;
#pragma omp parallel for collapse(2) if (B * H * Sq * Sk * D > kParallelGrain)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        F* gbias = sharedBias ? dbiasParts.data() + (b * H + h) * Sq * Sk
                   : dbiasOut ? dbiasOut + (b * H + h) * Sq * Sk
                              : nullptr;
        std::vector<F> gk(static_cast<size_t>(Sk * D), F(0)), gv(static_cast<size_t>(Sk * D), F(0)),
            gq(static_cast<size_t>(D));
        for (int64_t i = 0; i < Sq; ++i) {
          const T *qi = Q.row(b, h, i), *oi = O.row(b, h, i), *gi = dO.row(b, h, i);
          F delta = 0;
          for (int64_t d = 0; d < D; ++d) delta += F(gi[d]) * F(oi[d]);
          F lse = F(double(L[(b * H + h) * Sq + i]) / kLog2e);
          std::fill(gq.begin(), gq.end(), F(0));
          for (int64_t j = 0; j < Sk; ++j) {
            if (hidden(opt.causal, i, j, shift)) continue;
            const T *kj = K.row(b, h, j), *vj = V.row(b, h, j);
            F dot = 0, dp = 0;
            for (int64_t d = 0; d < D; ++d) {
              dot += F(qi[d]) * F(kj[d]);
              dp += F(gi[d]) * F(vj[d]);
            }
            F p = std::exp(dot * scale + bias.template at<F>(b, h, i, j) - lse);
            // With dropout (z: 0 or 1 / (1 - p_drop)): O = (P z) V, so dV takes P z, and the gradient at P is
            // z dP; delta = rowsum(dO O) is still rowsum(P z dP).
            F z = drop.template factor<F>(b, h, i, j);
            F dlogit = p * (z * dp - delta);  // the bias's gradient
            if (gbias != nullptr) gbias[i * Sk + j] += dlogit;
            F ds = dlogit * scale;
            for (int64_t d = 0; d < D; ++d) {
              gq[size_t(d)] += ds * F(kj[d]);
              gk[size_t(j * D + d)] += ds * F(qi[d]);
              gv[size_t(j * D + d)] += p * z * F(gi[d]);
            }
          }
          T* out = dQ.row(b, h, i);
          for (int64_t d = 0; d < D; ++d) out[d] = T(gq[size_t(d)]);
        }
        for (int64_t j = 0; j < Sk; ++j) {
          T *gkj = dK.row(b, h, j), *gvj = dV.row(b, h, j);
          for (int64_t d = 0; d < D; ++d) {
            gkj[d] = T(gk[size_t(j * D + d)]);
            gvj[d] = T(gv[size_t(j * D + d)]);
          }
        }
      }
    }
    if (sharedBias)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t e = 0; e < H * Sq * Sk; ++e) dbiasOut[e] += dbiasParts[size_t(b * H * Sq * Sk + e)];
  });
}

}  // namespace

void registerAttention(Registry& r) {
  r.add<FlashAttentionKernel>("flash_attention", DeviceType::CPU, &forward);
  r.add<FlashAttentionBackwardKernel>("flash_attention_backward", DeviceType::CPU, &backward);
}

}  // namespace strata::ops::cpu
