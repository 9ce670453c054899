// Differentiable matmul, softmax, norms, embedding, cross-entropy, dropout, cat/split and attention.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "strata/autograd/Fp8.h"
#include "strata/autograd/Functions.h"
#include "strata/autograd/GradMode.h"
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
// A tensor saved for the backward with its storage's version at save time. Used for the GEMMs' weight
// operands, the parameters that the optimizer rewrites in place: a second backward through a retained graph
// after an optimizer step must fail rather than use the new weights.
struct VersionedSave {
  Tensor tensor;
  uint64_t version = 0;
  explicit VersionedSave(const Tensor& t)
      : tensor(t.defined() ? t.detach() : t), version(t.defined() ? t.storage()->version() : 0) {}
  const Tensor& get(const char* fn) const {
    STRATA_CHECK(
        !tensor.defined() || tensor.storage()->version() == version,
        "{}: a weight saved for the backward was written in place after the forward (an optimizer step "
        "between the forward and a backward through a retained graph?)",
        fn);
    return tensor;
  }
};

// Parameters run in the compute dtype: a model trained in bf16 holds bf16 parameters (16-bit views into
// its chunks, NOTE [Gradient buffers] in Node.h), so a layer never casts a weight.
void checkComputeDType(const char* fn, const Tensor& x, std::initializer_list<Tensor> params) {
  for (const Tensor& p : params)
    STRATA_CHECK(!p.defined() || p.dtype() == x.dtype(),
                 "{}: {} input with a {} parameter{}; parameters are in the compute dtype (cast a model with "
                 "nn::Module::castParameters)",
                 fn, x.dtype(), p.dtype(), p.name().empty() ? "" : " ('" + p.name() + "')");
}

// A Linear's weight and bias gradients from its input x and output gradient g2 [rows, N], into the
// parameters' gradient buffers when they have them (the GEMM stores or adds in place), else returned in the
// parameters' gradient dtype. weight/bias: the leaves, undefined when they need no gradient.
void linearParamGradsFor(const Tensor& x, const Tensor& g2, const Tensor& weight, const Tensor& bias,
                         Tensor& gw, Tensor& gb) {
  bool nw = weight.defined(), nb = bias.defined();
  DType biasDType = nb ? autograd::gradDType(bias) : DType::F32;
  if (nw) {
    autograd::GradSink ws = autograd::claimGradBuffer(weight);
    if (ws) {
      gb = ops::linearParamGradsInto(x, g2, ws.buffer, ws.accumulate, nb, biasDType);
    } else {
      ops::LinearParamGrads pg = ops::linearParamGrads(x, g2, autograd::gradDType(weight), nb);
      gw = pg.weight;
      gb = pg.bias;
    }
  } else if (nb) {
    gb = ops::sum(g2, {0}, false, biasDType);
  }
  if (nb) {
    autograd::GradSink bs = autograd::claimGradBuffer(bias);
    if (bs) {
      if (bs.accumulate)
        ops::addInPlace(bs.buffer, gb);
      else
        ops::copy(bs.buffer, gb);
      gb = Tensor();
    }
  }
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
  STRATA_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(0),
               "linear: x {} does not match weight {} ([in, out])", toString(x.shape()),
               toString(weight.shape()));
  checkComputeDType("linear", x, {weight, bias});
  Tensor out = bias.defined() ? ops::linear(x, weight, bias) : ops::matmul(x, weight);
  bool nx = participates(x), nw = participates(weight), nb = participates(bias);
  Tensor sx = nw ? saved(x) : Tensor();
  VersionedSave sw(nx ? weight : Tensor());
  Tensor wLeaf = nw ? weight : Tensor(), bLeaf = nb ? bias : Tensor();
  Shape shX = x.shape();
  int64_t N = weight.size(1);
  std::vector<Tensor> inputs{x, weight};
  if (bias.defined()) inputs.push_back(bias);
  recordFunction("LinearBackward", inputs, {out}, [=](const Grads& gs) {
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {-1, N});
    Tensor gx, gw, gb;
    if (nx) gx = detail::viewRaw(ops::matmul(g2, transposeLast(sw.get("linear"))), shX);
    if (nw) {
      linearParamGradsFor(sx, g2, wLeaf, bLeaf, gw, gb);
    } else if (nb) {
      linearParamGradsFor(Tensor(), g2, Tensor(), bLeaf, gw, gb);
    }
    Grads grads{gx, gw};
    if (bias.defined()) grads.push_back(gb);
    return grads;
  });
  return out;
}

Tensor geluMlp(const Tensor& x, const Tensor& fcWeight, const Tensor& fcBias, const Tensor& projWeight,
               const Tensor& projBias, bool recomputeGelu) {
  STRATA_CHECK(fcWeight.dim() == 2 && projWeight.dim() == 2 && x.dim() >= 1 &&
                   x.size(-1) == fcWeight.size(0) && projWeight.size(0) == fcWeight.size(1),
               "geluMlp: x {} does not fit fc {} and proj {} ([in, out])", toString(x.shape()),
               toString(fcWeight.shape()), toString(projWeight.shape()));
  checkComputeDType("geluMlp", x, {fcWeight, fcBias, projWeight, projBias});
  const Tensor &w1 = fcWeight, &b1 = fcBias, &w2 = projWeight, &b2 = projBias;
  int64_t F = fcWeight.size(1), O = projWeight.size(1);
  // h = gelu(pre) and pre from the fc GEMM's epilogue; the projection adds its bias in its own epilogue.
  ops::LinearGeluResult fc = ops::linearGelu(x, w1, b1);
  Tensor out = b2.defined() ? ops::linear(fc.out, w2, b2) : ops::matmul(fc.out, w2);
  bool nx = participates(x), nw1 = participates(fcWeight), nb1 = participates(fcBias);
  bool nw2 = participates(projWeight), nb2 = participates(projBias);
  Tensor sx = nw1 || nb1 ? saved(x) : Tensor();
  VersionedSave sw1(nx ? w1 : Tensor()), sw2(w2);
  Tensor pre = fc.pre.detach(), h = (nw2 || nb2) && !recomputeGelu ? fc.out.detach() : Tensor();
  bool again = (nw2 || nb2) && recomputeGelu;
  Shape shX = x.shape();
  Tensor w1Leaf = nw1 ? fcWeight : Tensor(), b1Leaf = nb1 ? fcBias : Tensor();
  Tensor w2Leaf = nw2 ? projWeight : Tensor(), b2Leaf = nb2 ? projBias : Tensor();
  std::vector<Tensor> inputs{x, fcWeight, fcBias, projWeight, projBias};
  recordFunction("GeluMlpBackward", inputs, {out}, [=](const Grads& gs) {
    Tensor g2 = detail::viewRaw(ops::contiguous(gs[0]), {-1, O});
    Grads grads(5);
    if (nw2 || nb2)
      linearParamGradsFor(again ? ops::geluTanh(pre) : h, g2, w2Leaf, b2Leaf, grads[3], grads[4]);
    // The gradient at the GELU's input in one GEMM: (g W2^T) * gelu'(pre).
    Tensor dpre =
        ops::matmulGeluBackward(g2, transposeLast(sw2.get("geluMlp")), detail::viewRaw(pre, {-1, F}));
    if (nw1 || nb1) linearParamGradsFor(sx, dpre, w1Leaf, b1Leaf, grads[1], grads[2]);
    if (nx) grads[0] = detail::viewRaw(ops::matmul(dpre, transposeLast(sw1.get("geluMlp"))), shX);
    return grads;
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
  ops::NormResult stats{Tensor(), r.mean, r.rstd, Tensor()};
  bool nw = participates(weight), nb = participates(bias);
  DType pg = weight.defined() ? autograd::gradDType(weight) : x.dtype();
  recordFunction("LayerNormBackward", {x, weight, bias}, {r.y}, [=](const Grads& g) {
    ops::NormGrads grads = ops::layerNormBackward(g[0], sx, sw, stats, nw, nb, Tensor(), pg);
    return Grads{grads.x, grads.weight, grads.bias};
  });
  return r.y;
}

std::array<Tensor, 2> addLayerNorm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                   const Tensor& bias, double eps) {
  ops::NormResult r = ops::layerNorm(x, weight, bias, eps, residual);
  Tensor ssum = r.sum.detach(), sw = saved(weight);
  ops::NormResult stats{Tensor(), r.mean, r.rstd, Tensor()};
  bool nw = participates(weight), nb = participates(bias);
  bool nin = participates(x) || participates(residual);
  DType pg = weight.defined() ? autograd::gradDType(weight) : x.dtype();
  recordFunction("AddLayerNormBackward", {x, residual, weight, bias}, {r.sum, r.y}, [=](const Grads& g) {
    // g[0] reaches the sum through the residual stream, g[1] through the norm; both end at x and residual.
    ops::NormGrads grads = ops::layerNormBackward(g[1], ssum, sw, stats, nw, nb, g[0], pg);
    Tensor gin = nin ? grads.x : Tensor();
    return Grads{gin, gin, grads.weight, grads.bias};
  });
  return {r.sum, r.y};
}

Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  ops::NormResult r = ops::rmsNorm(x, weight, eps);
  Tensor sx = saved(x), sw = saved(weight);
  ops::NormResult stats{Tensor(), Tensor(), r.rstd, Tensor()};
  bool nw = participates(weight);
  DType pg = autograd::gradDType(weight);
  recordFunction("RmsNormBackward", {x, weight}, {r.y}, [=](const Grads& g) {
    ops::NormGrads grads = ops::rmsNormBackward(g[0], sx, sw, stats, nw, pg);
    return Grads{grads.x, grads.weight};
  });
  return r.y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t paddingIdx) {
  Tensor out = ops::embedding(weight, indices);
  Tensor idx = saved(indices);
  int64_t V = weight.size(0);
  DType dt = participates(weight) ? autograd::gradDType(weight) : weight.dtype();
  Tensor leaf = participates(weight) ? weight : Tensor();
  recordFunction("EmbeddingBackward", {weight}, {out}, [=](const Grads& g) {
    Tensor g2 = detail::viewRaw(ops::contiguous(g[0]), {-1, g[0].size(-1)});
    Tensor ids = detail::viewRaw(ops::contiguous(idx), {-1});
    if (paddingIdx >= 0) {
      // The padding id's rows of the output gradient become zeros before the scatter. The comparison is in
      // fp32 (exact for ids below 2^24); its 0/1 then scales the rows in their own dtype.
      Tensor id = ids.to(ids.device(), DType::F32);
      Tensor pad = ops::eq(id, ops::full({}, double(paddingIdx), DType::F32, id.device()));
      Tensor keep = ops::affine(pad, -1.0, 1.0).to(g2.device(), g2.dtype());
      g2 = ops::mul(g2, detail::viewRaw(keep, {-1, 1}));
    }
    // Scattered straight into the table's gradient buffer when it has one (a [V, C] pass saved).
    autograd::GradSink sink = autograd::claimGradBuffer(leaf);
    if (sink && sink.buffer.dtype() == (g2.dtype() == DType::F64 ? DType::F64 : DType::F32)) {
      ops::embeddingBackwardInto(g2, ids, sink.buffer, sink.accumulate);
      return Grads{Tensor()};
    }
    if (sink) {
      Tensor gw = ops::embeddingBackward(g2, ids, V, sink.buffer.dtype());
      sink.accumulate ? ops::addInPlace(sink.buffer, gw) : ops::copy(sink.buffer, gw);
      return Grads{Tensor()};
    }
    return Grads{ops::embeddingBackward(g2, ids, V, dt)};
  });
  return out;
}

Tensor crossEntropy(const Tensor& logits, const Tensor& target, int64_t ignoreIndex) {
  ops::CrossEntropyResult r = ops::crossEntropy(logits, target, ignoreIndex);
  Tensor sl = saved(logits), st = saved(target);
  ops::CrossEntropyResult keep{Tensor(), r.lse, r.count, Tensor()};
  recordFunction("CrossEntropyBackward", {logits}, {r.loss}, [=](const Grads& g) {
    return Grads{ops::crossEntropyBackward(g[0], sl, st, keep, ignoreIndex)};
  });
  return r.loss;
}

Tensor linearCrossEntropy(const Tensor& x, const Tensor& weight, const Tensor& target, int64_t ignoreIndex,
                          int64_t chunkRows, const autograd::Fp8LinearState* fp8) {
  STRATA_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
               "linearCrossEntropy: x must be [N, C] and weight [V, C], got {} and {}", toString(x.shape()),
               toString(weight.shape()));
  STRATA_CHECK(target.dim() == 1 && target.size(0) == x.size(0),
               "linearCrossEntropy: target must be [{}], got {}", x.size(0), toString(target.shape()));
  checkComputeDType("linearCrossEntropy", x, {weight});
  DType compute = x.dtype(), gradType = autograd::gradDType(weight);
  int64_t N = x.size(0), V = weight.size(0), C = x.size(1);
  Device dev = x.device();
  const Tensor& w = weight;
  Tensor wT = transposeLast(w);
  if (chunkRows <= 0) chunkRows = linearCrossEntropyChunkRows(N, V);
  bool nx = participates(x), nw = participates(weight);
  bool grads = gradEnabled() && (nx || nw);
  DType sd = compute == DType::F64 ? DType::F64 : DType::F32;  // loss statistics
  // Per-row losses and counted flags, summed once at the end (a reduction per chunk would cost launches).
  Tensor rowLoss = Tensor::empty({N}, sd, dev), valid = Tensor::empty({N}, sd, dev);
  Tensor gx = nx && grads ? Tensor::empty({N, C}, compute, dev) : Tensor();
  // Written by the first chunk's GEMM (beta 0); zeros only when there are no rows at all.
  Tensor gw = nw && grads ? (N > 0 ? Tensor::empty({V, C}, gradType, dev) : ops::zeros({V, C}, gradType, dev))
                          : Tensor();
  Tensor one = ops::ones({}, sd, dev);
  Tensor xd = x.detach(), tgt = ops::contiguous(target);
  // FP8 (NOTE [FP8 training]): chunks of a multiple of 16 rows, the weight cast once for all of them, as
  // [V, C] for the logits and [C, V] for x's gradient; each chunk's x as [rows, C] and [C, rows], its softmax
  // gradient as [rows, V] and [V, rows]. Amaxes are recorded when gradients are formed.
  bool inFp8 = fp8 && chunkRows >= 16 && ops::fp8Shape(N, C, V);
  if (inFp8) chunkRows = chunkRows / 16 * 16;
  Tensor fp8State;
  ops::Fp8Codes wq;
  if (inFp8) {
    fp8State = fp8->state;
    wq = ops::fp8Cast(w, Fp8Format::E4M3, fp8State.narrow(0, fp8ScaleSlot(1), 1),
                      autograd::fp8Amax(*fp8, 1, grads), true, grads && nx);
  }
  auto scaleOf = [&](int role) { return fp8State.narrow(0, fp8ScaleSlot(role), 1); };
  auto inverseOf = [&](int role) { return fp8State.narrow(0, fp8InverseSlot(role), 1); };
  for (int64_t r0 = 0; r0 < N; r0 += chunkRows) {
    int64_t rows = std::min(chunkRows, N - r0);
    Tensor xc = detail::narrowRaw(xd, 0, r0, rows), tc = detail::narrowRaw(tgt, 0, r0, rows);
    if (inFp8) {
      ops::Fp8Codes xq =
          ops::fp8Cast(xc, Fp8Format::E4M3, scaleOf(0), autograd::fp8Amax(*fp8, 0, grads), true, grads && nw);
      Tensor logits = Tensor::empty({rows, V}, compute, dev);
      ops::fp8MatmulInto(logits, xq.plain, Fp8Format::E4M3, inverseOf(0), wq.plain, Fp8Format::E4M3,
                         inverseOf(1), Tensor(), false, ops::fp8FastForward());
      ops::crossEntropyInPlace(logits, tc, detail::narrowRaw(rowLoss, 0, r0, rows),
                               detail::narrowRaw(valid, 0, r0, rows), grads, ignoreIndex);
      if (!grads) continue;
      ops::Fp8Codes gq =
          ops::fp8Cast(logits, Fp8Format::E5M2, scaleOf(2), autograd::fp8Amax(*fp8, 2, true), nx, nw);
      if (nx)
        ops::fp8MatmulInto(detail::narrowRaw(gx, 0, r0, rows), gq.plain, Fp8Format::E5M2, inverseOf(2),
                           wq.transposed, Fp8Format::E4M3, inverseOf(1), Tensor(), false);
      if (nw)
        ops::fp8MatmulInto(gw, gq.transposed, Fp8Format::E5M2, inverseOf(2), xq.transposed, Fp8Format::E4M3,
                           inverseOf(0), Tensor(), r0 > 0);
      continue;
    }
    Tensor logits = ops::matmul(xc, wT);
    // The loss and, with grads, the unnormalised softmax-minus-one-hot in place of the logits: the 1 / count
    // of the whole batch comes in the backward.
    ops::crossEntropyInPlace(logits, tc, detail::narrowRaw(rowLoss, 0, r0, rows),
                             detail::narrowRaw(valid, 0, r0, rows), grads, ignoreIndex);
    if (!grads) continue;
    if (nx) ops::matmulInto(detail::narrowRaw(gx, 0, r0, rows), logits, w);
    if (nw && r0 == 0) ops::matmulInto(gw, transposeLast(logits), xc);
    if (nw && r0 > 0) ops::matmulAccumulate(gw, transposeLast(logits), xc);
  }
  Tensor lossSum = ops::sum(rowLoss), counted = ops::sum(valid);
  Tensor total = ops::maximum(counted, one);
  Tensor loss = ops::div(lossSum, total);
  if (!grads) return loss;
  std::vector<Tensor> inputs{x, weight};
  recordFunction("LinearCrossEntropyBackward", inputs, {loss}, [=](const Grads& g) {
    // d(loss) / d(sum of row losses) = incoming gradient / count.
    Tensor scale = ops::div(ops::to(g[0], dev, sd), total);
    Tensor dx, dw;
    // Scaled in fp32: 1 / count rounded to bf16 would bias every gradient by up to 0.4 %.
    auto scaled = [&](const Tensor& t) {
      if (t.dtype() == sd) return ops::mul(t, scale);
      return ops::to(ops::mul(ops::to(t, dev, sd), scale), dev, t.dtype());
    };
    if (nx) dx = scaled(gx);
    if (nw) dw = scaled(gw);
    return Grads{dx, dw};
  });
  return loss;
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  if (!training || p == 0.0) return x;
  uint64_t seed = gen.seed(), offset = gen.reserve(uint64_t(x.numel()), 8);
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

bool fusedAttentionDropout() {
  static const bool fused = [] {
    const char* e = std::getenv("STRATA_ATTENTION_DROPOUT");
    if (e == nullptr || std::strcmp(e, "fused") == 0) return true;
    STRATA_USER_CHECK(std::strcmp(e, "composed") == 0,
                      "STRATA_ATTENTION_DROPOUT is '{}': fused (the default) or composed", e);
    return false;
  }();
  return fused;
}

bool flashAttentionUsable(const Tensor& q, const Tensor& k, const Tensor& v, double dropoutP, bool training) {
  static const bool disabled = [] {
    const char* e = std::getenv("STRATA_ATTENTION");
    return e != nullptr && std::strcmp(e, "composed") == 0;
  }();
  if (disabled || (training && dropoutP > 0.0 && !fusedAttentionDropout()) || !q.device().isCuda())
    return false;
  return ops::flashAttentionSupported(q, k, v);
}

namespace {
// The options of a fused attention call; with dropout, a [B, H, Sq, Sk] draw from `gen`, as the composed
// path's dropout of its probabilities draws (NOTE [Fused attention dropout]).
ops::AttentionOptions attentionOptions(const Tensor& q, const Tensor& k, bool causal, double scale,
                                       double dropoutP, Generator& gen, const Tensor& bias) {
  ops::AttentionOptions o{scale, causal};
  o.bias = saved(bias);
  if (dropoutP > 0.0) {
    o.dropout = dropoutP;
    o.seed = gen.seed();
    o.offset = gen.reserve(uint64_t(q.size(0) * q.size(2) * q.size(1) * k.size(1)), 8);
  }
  return o;
}

// The bias's gradient buffer when it wants one (NOTE [Biased fused attention]), else undefined.
Tensor biasGradBuffer(const Tensor& bias, bool wanted) {
  return bias.defined() && wanted ? Tensor::empty(bias.shape(), bias.dtype(), bias.device()) : Tensor();
}
}  // namespace

bool fusedAttentionTakes(const AttentionMask& mask, int64_t B, int64_t H, int64_t Sq, int64_t Sk,
                         DType dtype) {
  if (mask.keyPadding.defined()) return false;
  if (!mask.bias.defined()) return true;
  const Tensor& b = mask.bias;
  return b.dim() == 4 && (b.size(0) == 1 || b.size(0) == B) && b.size(1) == H && b.size(2) == Sq &&
         b.size(3) == Sk && b.dtype() == dtype;
}

Tensor flashAttention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                      double dropoutP, Generator& gen, const Tensor& bias) {
  ops::AttentionOptions o = attentionOptions(q, k, causal, scale, dropoutP, gen, bias);
  ops::FlashAttentionResult r = ops::flashAttention(q, k, v, o);
  Tensor sq = saved(q), sk = saved(k), sv = saved(v);
  ops::FlashAttentionResult keep = r;
  keep.out = r.out.detach();
  bool biasGrad = participates(bias);
  recordFunction("FlashAttentionBackward", {q, k, v, bias}, {r.out}, [=](const Grads& g) {
    Tensor dq = ops::emptyLike(sq), dk = ops::emptyLike(sk), dv = ops::emptyLike(sv);  // contiguous
    Tensor dbias = biasGradBuffer(o.bias, biasGrad);
    ops::flashAttentionBackward(sq, sk, sv, keep, g[0], dq, dk, dv, o, dbias);
    return Grads{dq, dk, dv, dbias};
  });
  return r.out;
}

Tensor flashAttentionPacked(const Tensor& qkv, int64_t heads, bool causal, double scale, double dropoutP,
                            Generator& gen, const Tensor& bias) {
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
  ops::AttentionOptions o = attentionOptions(q, k, causal, scale, dropoutP, gen, bias);
  ops::FlashAttentionResult r = ops::flashAttention(q, k, v, o);
  ops::FlashAttentionResult keep = r;
  keep.out = r.out.detach();
  Tensor out = detail::viewRaw(r.out, {B, S, heads * D});
  bool biasGrad = participates(bias);
  recordFunction("FlashAttentionBackward", {qkv, bias}, {out}, [=](const Grads& g) {
    Tensor grad = Tensor::empty({B, S, 3 * heads * D}, packed.dtype(), packed.device());
    auto [dq, dk, dv] = parts(grad);
    auto [sq, sk, sv] = parts(packed);
    Tensor dout = detail::viewRaw(ops::contiguous(g[0]), {B, S, heads, D});
    Tensor dbias = biasGradBuffer(o.bias, biasGrad);
    ops::flashAttentionBackward(sq, sk, sv, keep, dout, dq, dk, dv, o, dbias);
    return Grads{grad, dbias};
  });
  return out;
}

}  // namespace strata
