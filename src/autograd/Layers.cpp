// Differentiable matmul, softmax, norms, embedding, cross-entropy, dropout, cat/split and attention.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/autograd/Functions.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::Grads;
using autograd::participates;
using autograd::recordFunction;

namespace {
Tensor saved(const Tensor& t) {
  return t.defined() ? t.detach() : t;
}
Tensor transposeLast(const Tensor& t) {
  std::vector<int64_t> perm(static_cast<size_t>(t.dim()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return detail::permuteRaw(t, perm);
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  Tensor out = ops::matmul(a, b);
  bool na = participates(a), nb = participates(b);
  Tensor sa = nb ? saved(a) : Tensor(), sb = na ? saved(b) : Tensor();
  Shape shA = a.shape(), shB = b.shape();
  recordFunction("MatmulBackward", {a, b}, {out}, [=](const Grads& gs) {
    const Tensor& g = gs[0];
    Tensor ga, gb;
    if (na) ga = ops::sumTo(ops::matmul(g, transposeLast(sb)), shA);
    if (nb) {
      if (shB.size() == 2 && shA.size() > 2) {
        // A weight shared across the batch: one GEMM over the flattened rows instead of a batch of them.
        int64_t k = shA.back(), n = shB.back();
        Tensor a2 = ops::contiguous(sa), g2 = ops::contiguous(g);
        a2 = detail::viewRaw(a2, {-1, k});
        g2 = detail::viewRaw(g2, {-1, n});
        gb = ops::matmul(transposeLast(a2), g2);
      } else {
        gb = ops::sumTo(ops::matmul(transposeLast(sa), g), shB);
      }
    }
    return Grads{ga, gb};
  });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!bias.defined()) return matmul(x, weight);
  Tensor out = ops::linear(x, weight, bias);
  bool nx = participates(x), nw = participates(weight), nb = participates(bias);
  Tensor sx = nw ? saved(x) : Tensor(), sw = nx ? saved(weight) : Tensor();
  Shape shX = x.shape();
  int64_t K = weight.size(0), N = weight.size(1);
  recordFunction("LinearBackward", {x, weight, bias}, {out}, [=](const Grads& gs) {
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {-1, N});
    Tensor gx, gw, gb;
    if (nx) gx = detail::viewRaw(ops::matmul(g2, transposeLast(sw)), shX);
    if (nw) gw = ops::matmul(transposeLast(detail::viewRaw(ops::contiguous(sx), {-1, K})), g2);
    if (nb) gb = ops::sumTo(g2, {N});
    return Grads{gx, gw, gb};
  });
  return out;
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = ops::softmax(x, dim);
  Tensor y = saved(out);
  recordFunction("SoftmaxBackward", {x}, {out},
                 [y, dim](const Grads& g) { return Grads{ops::softmaxBackward(y, g[0], dim, false)}; });
  return out;
}

Tensor scaledSoftmax(const Tensor& x, double scale, bool causal) {
  Tensor out = ops::scaledSoftmax(x, scale, causal);
  Tensor y = saved(out);
  recordFunction("ScaledSoftmaxBackward", {x}, {out},
                 [y, scale](const Grads& g) { return Grads{ops::scaledSoftmaxBackward(y, g[0], scale)}; });
  return out;
}

Tensor logSoftmax(const Tensor& x, int64_t dim) {
  Tensor out = ops::logSoftmax(x, dim);
  Tensor y = saved(out);
  recordFunction("LogSoftmaxBackward", {x}, {out},
                 [y, dim](const Grads& g) { return Grads{ops::softmaxBackward(y, g[0], dim, true)}; });
  return out;
}

Tensor layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ops::NormResult r = ops::layerNorm(x, weight, bias, eps);
  Tensor sx = saved(x), sw = saved(weight);
  ops::NormResult stats{Tensor(), r.mean, r.rstd};
  bool nw = participates(weight), nb = participates(bias);
  recordFunction("LayerNormBackward", {x, weight, bias}, {r.y}, [=](const Grads& g) {
    ops::NormGrads grads = ops::layerNormBackward(g[0], sx, sw, stats, nw, nb);
    return Grads{grads.x, grads.weight, grads.bias};
  });
  return r.y;
}

Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  ops::NormResult r = ops::rmsNorm(x, weight, eps);
  Tensor sx = saved(x), sw = saved(weight);
  ops::NormResult stats{Tensor(), Tensor(), r.rstd};
  bool nw = participates(weight);
  recordFunction("RmsNormBackward", {x, weight}, {r.y}, [=](const Grads& g) {
    ops::NormGrads grads = ops::rmsNormBackward(g[0], sx, sw, stats, nw);
    return Grads{grads.x, grads.weight};
  });
  return r.y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = ops::embedding(weight, indices);
  Tensor idx = saved(indices);
  int64_t V = weight.size(0);
  DType dt = weight.dtype();
  recordFunction("EmbeddingBackward", {weight}, {out}, [=](const Grads& g) {
    Tensor g2 = detail::viewRaw(ops::contiguous(g[0]), {-1, g[0].size(-1)});
    return Grads{ops::embeddingBackward(g2, detail::viewRaw(ops::contiguous(idx), {-1}), V, dt)};
  });
  return out;
}

Tensor crossEntropy(const Tensor& logits, const Tensor& target, int64_t ignoreIndex) {
  ops::CrossEntropyResult r = ops::crossEntropy(logits, target, ignoreIndex);
  Tensor sl = saved(logits), st = saved(target);
  ops::CrossEntropyResult keep{Tensor(), r.lse, r.count};
  recordFunction("CrossEntropyBackward", {logits}, {r.loss}, [=](const Grads& g) {
    return Grads{ops::crossEntropyBackward(g[0], sl, st, keep, ignoreIndex)};
  });
  return r.loss;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (!training || p == 0.0) return x;
  uint64_t seed = gen.seed(), offset = gen.reserve(uint64_t(x.numel()));
  Tensor out = ops::dropout(x, p, seed, offset);
  Shape shape = x.shape();
  recordFunction("DropoutBackward", {x}, {out}, [=](const Grads& g) {
    // Replays the same mask from (seed, offset): nothing was stored.
    return Grads{detail::viewRaw(ops::dropout(g[0], p, seed, offset), shape)};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = ops::cat(tensors, dim);
  int64_t d = wrapDim(dim, out.dim(), "cat");
  std::vector<int64_t> sizes;
  for (const auto& t : tensors) sizes.push_back(t.shape()[size_t(d)]);
  recordFunction("CatBackward", tensors, {out}, [=](const Grads& g) {
    Grads grads;
    int64_t offset = 0;
    for (int64_t s : sizes) {
      grads.push_back(detail::narrowRaw(g[0], d, offset, s));
      offset += s;
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  int64_t d = wrapDim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  STRATA_CHECK(total == x.size(d), "split: sizes add up to {} but dimension {} has size {}", total, d,
               x.size(d));
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.narrow(d, offset, s));
    offset += s;
  }
  return parts;
}

Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                                 double dropoutP, bool training, double scale, Generator& gen) {
  STRATA_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
               "attention: q, k, v must be [B, H, S, D]; got {}, {}, {}", toString(q.shape()),
               toString(k.shape()), toString(v.shape()));
  int64_t B = q.size(0), Sq = q.size(2), Sk = k.size(2), D = q.size(3);
  double s = scale > 0 ? scale : 1.0 / std::sqrt(double(D));
  Tensor scores = matmul(q, k.transpose(-1, -2));
  // Scale and causal mask are applied inside the softmax kernel (one pass over the scores) unless an additive
  // bias has to come first.
  double softmaxScale = s;
  if (mask.bias.defined()) {
    scores = scores * s + mask.bias;
    softmaxScale = 1.0;
  }
  if (mask.keyPadding.defined()) {
    STRATA_CHECK(mask.keyPadding.shape() == Shape({B, Sk}),
                 "attention: key padding mask must be [{}, {}], got {}", B, Sk,
                 toString(mask.keyPadding.shape()));
    Tensor pad = detail::viewRaw(ops::contiguous(mask.keyPadding), {B, 1, 1, Sk});
    scores = maskedFill(scores, pad, -INFINITY);
  }
  STRATA_CHECK(!mask.causal || Sk >= Sq, "attention: causal masking needs S_k >= S_q, got {} and {}", Sk, Sq);
  Tensor probs = scaledSoftmax(scores, softmaxScale, mask.causal);
  probs = dropout(probs, dropoutP, training, gen);
  return matmul(probs, v);
}

bool flashAttentionUsable(const Tensor& q, const Tensor& k, const Tensor& v, double dropoutP, bool training) {
  static const bool disabled = [] {
    const char* e = std::getenv("STRATA_ATTENTION");
    return e != nullptr && std::strcmp(e, "composed") == 0;
  }();
  if (disabled || (training && dropoutP > 0.0) || !q.device().isCuda()) return false;
  return ops::flashAttentionSupported(q, k, v);
}

Tensor flashAttention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  ops::AttentionOptions o{scale, causal};
  ops::FlashAttentionResult r = ops::flashAttention(q, k, v, o);
  Tensor sq = saved(q), sk = saved(k), sv = saved(v);
  ops::FlashAttentionResult keep{r.out.detach(), r.lse2};
  recordFunction("FlashAttentionBackward", {q, k, v}, {r.out}, [=](const Grads& g) {
    Tensor dq = ops::emptyLike(sq), dk = ops::emptyLike(sk), dv = ops::emptyLike(sv);
    if (!dq.isContiguous()) dq = Tensor::empty(sq.shape(), sq.dtype(), sq.device());
    if (!dk.isContiguous()) dk = Tensor::empty(sk.shape(), sk.dtype(), sk.device());
    if (!dv.isContiguous()) dv = Tensor::empty(sv.shape(), sv.dtype(), sv.device());
    ops::flashAttentionBackward(sq, sk, sv, keep, g[0], dq, dk, dv, o);
    return Grads{dq, dk, dv};
  });
  return r.out;
}

Tensor flashAttentionPacked(const Tensor& qkv, int64_t heads, bool causal, double scale) {
  STRATA_CHECK(qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0,
               "flash attention: qkv must be [B, S, 3 * heads * D] for {} heads, got {}", heads,
               toString(qkv.shape()));
  int64_t B = qkv.size(0), S = qkv.size(1), D = qkv.size(2) / (3 * heads);
  Tensor packed = qkv.isContiguous() ? qkv.detach() : ops::contiguous(qkv.detach());
  auto parts = [B, S, heads, D](const Tensor& t) {
    Tensor five = detail::viewRaw(t, {B, S, 3, heads, D});
    auto part = [&five](int64_t i) { return detail::squeezeRaw(detail::narrowRaw(five, 2, i, 1), 2); };
    return std::array<Tensor, 3>{part(0), part(1), part(2)};
  };
  auto [q, k, v] = parts(packed);
  ops::AttentionOptions o{scale, causal};
  ops::FlashAttentionResult r = ops::flashAttention(q, k, v, o);
  ops::FlashAttentionResult keep{r.out.detach(), r.lse2};
  Tensor out = detail::viewRaw(r.out, {B, S, heads * D});
  recordFunction("FlashAttentionBackward", {qkv}, {out}, [=](const Grads& g) {
    Tensor grad = Tensor::empty({B, S, 3 * heads * D}, packed.dtype(), packed.device());
    auto [dq, dk, dv] = parts(grad);
    auto [sq, sk, sv] = parts(packed);
    Tensor dout = detail::viewRaw(ops::contiguous(g[0]), {B, S, heads, D});
    ops::flashAttentionBackward(sq, sk, sv, keep, dout, dq, dk, dv, o);
    return Grads{grad};
  });
  return out;
}

}  // namespace strata
