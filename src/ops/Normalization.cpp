// Front ends of softmax and LayerNorm/RMSNorm.
#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {
namespace {

// Moves `dim` last and makes the tensor contiguous; returns the permutation to undo it (empty when none).
Tensor lastDimContiguous(const Tensor& x, int64_t dim, std::vector<int64_t>& perm) {
  int64_t d = wrapDim(dim, x.dim(), "softmax");
  perm.clear();
  if (d == x.dim() - 1 || x.dim() == 0) return contiguous(x);
  for (int64_t i = 0; i < x.dim(); ++i) perm.push_back(i);
  std::swap(perm[size_t(d)], perm.back());
  return contiguous(detail::permuteRaw(x, perm));
}

Tensor softmaxImpl(const Tensor& x, int64_t dim, bool log) {
  STRATA_CHECK(isFloating(x.dtype()), "softmax: floating input required, got {}", x.dtype());
  std::vector<int64_t> perm;
  Tensor in = lastDimContiguous(x, dim, perm);
  Tensor out = emptyLike(in);
  if (out.numel() > 0) kernel<SoftmaxKernel>("softmax", x.device())(in, out, log, SoftmaxOptions{});
  return perm.empty() ? out : detail::permuteRaw(out, perm);
}

void checkNormArgs(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  STRATA_CHECK(x.dim() >= 1, "{}: input needs at least one dimension", op);
  STRATA_CHECK(isFloating(x.dtype()), "{}: floating input required, got {}", op, x.dtype());
  int64_t C = x.size(-1);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    STRATA_CHECK(p->shape() == Shape{C}, "{}: parameter shape {} must be [{}] (the last dim of {})", op,
                 toString(p->shape()), C, toString(x.shape()));
    // Parameters in x's dtype, or fp32 masters read directly by the kernel (mixed precision).
    STRATA_CHECK(
        (p->dtype() == x.dtype() || p->dtype() == statsDType(x.dtype())) && p->device() == x.device(),
        "{}: parameters must be on the input's device, in its dtype or {} (got {} for {} input)", op,
        statsDType(x.dtype()), p->dtype(), x.dtype());
  }
  STRATA_CHECK(!weight.defined() || !bias.defined() || weight.dtype() == bias.dtype(),
               "{}: weight and bias dtypes differ ({} and {})", op, weight.dtype(), bias.dtype());
}

NormResult normImpl(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight,
                    const Tensor& bias, double eps, bool rms) {
  checkNormArgs(op, x, weight, bias);
  Tensor in = contiguous(x);
  Tensor res;
  if (residual.defined()) {
    STRATA_CHECK(
        residual.shape() == x.shape() && residual.dtype() == x.dtype() && residual.device() == x.device(),
        "{}: residual {} {} must match the input {} {}", op, toString(residual.shape()), residual.dtype(),
        toString(x.shape()), x.dtype());
    res = contiguous(residual);
  }
  int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  DType sd = statsDType(x.dtype());
  NormResult r;
  r.y = emptyLike(in);
  if (res.defined()) r.sum = emptyLike(in);
  r.rstd = Tensor::empty({N}, sd, x.device());
  if (!rms) r.mean = Tensor::empty({N}, sd, x.device());
  Tensor w = weight.defined() ? contiguous(weight) : Tensor();
  Tensor b = bias.defined() ? contiguous(bias) : Tensor();
  if (in.numel() > 0)
    kernel<NormKernel>("norm", x.device())(in, res, r.sum, w, b, r.y, r.mean, r.rstd, eps, rms);
  return r;
}

NormGrads normBackwardImpl(const Tensor& gy, const Tensor& x, const Tensor& weight, const NormResult& saved,
                           bool needWeight, bool needBias, bool rms, const Tensor& gextra,
                           std::optional<DType> paramGrads) {
  STRATA_CHECK(gy.shape() == x.shape(), "norm backward: gradient shape {} differs from input shape {}",
               toString(gy.shape()), toString(x.shape()));
  STRATA_CHECK(!gextra.defined() || (gextra.shape() == x.shape() && gextra.dtype() == x.dtype()),
               "norm backward: the extra gradient must match the input");
  Tensor g = contiguous(gy), in = contiguous(x);
  Tensor extra = gextra.defined() ? contiguous(gextra) : Tensor();
  Tensor w = weight.defined() ? contiguous(weight) : Tensor();
  int64_t C = x.size(-1);
  DType sd = statsDType(x.dtype());
  NormGrads grads;
  grads.x = emptyLike(in);
  Tensor gw = needWeight ? Tensor::empty({C}, sd, x.device()) : Tensor();
  Tensor gb = needBias ? Tensor::empty({C}, sd, x.device()) : Tensor();
  if (in.numel() > 0) {
    kernel<NormBackwardKernel>("norm_backward", x.device())(g, in, w, saved.mean, saved.rstd, extra, grads.x,
                                                            gw, gb, rms);
  } else {
    if (gw.defined()) fill(gw, 0.0);
    if (gb.defined()) fill(gb, 0.0);
  }
  // Parameter gradients in the parameters' dtype: fp32 masters get the kernel's fp32 sums as they are.
  DType pd = paramGrads.value_or(weight.defined() ? weight.dtype() : x.dtype());
  if (gw.defined()) grads.weight = gw.dtype() == pd ? gw : to(gw, x.device(), pd);
  if (gb.defined()) grads.bias = gb.dtype() == pd ? gb : to(gb, x.device(), pd);
  return grads;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmaxImpl(x, dim, false);
}
Tensor logSoftmax(const Tensor& x, int64_t dim) {
  return softmaxImpl(x, dim, true);
}

Tensor softmaxBackward(const Tensor& y, const Tensor& gy, int64_t dim, bool log) {
  std::vector<int64_t> perm;
  Tensor yc = lastDimContiguous(y, dim, perm);
  Tensor gc = lastDimContiguous(gy, dim, perm);
  Tensor gx = emptyLike(yc);
  if (gx.numel() > 0) kernel<SoftmaxBackwardKernel>("softmax_backward", y.device())(yc, gc, gx, log, 1.0);
  return perm.empty() ? gx : detail::permuteRaw(gx, perm);
}

Tensor scaledSoftmax(const Tensor& x, double scale, bool causal) {
  STRATA_CHECK(x.dim() >= 2, "scaled softmax: input needs [..., S_q, S_k], got {}", toString(x.shape()));
  STRATA_CHECK(isFloating(x.dtype()), "scaled softmax: floating input required, got {}", x.dtype());
  int64_t Sq = x.size(-2), Sk = x.size(-1);
  STRATA_CHECK(!causal || Sk >= Sq, "causal softmax needs at least as many keys ({}) as queries ({})", Sk,
               Sq);
  Tensor in = contiguous(x);
  Tensor out = emptyLike(in);
  SoftmaxOptions o{scale, causal ? Sq : 0, Sk - Sq};
  if (out.numel() > 0) kernel<SoftmaxKernel>("softmax", x.device())(in, out, false, o);
  return out;
}

Tensor scaledSoftmaxBackward(const Tensor& y, const Tensor& gy, double scale) {
  Tensor yc = contiguous(y), gc = contiguous(gy);
  Tensor gx = emptyLike(yc);
  if (gx.numel() > 0) kernel<SoftmaxBackwardKernel>("softmax_backward", y.device())(yc, gc, gx, false, scale);
  return gx;
}

NormResult layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                     const Tensor& residual) {
  return normImpl("layer_norm", x, residual, weight, bias, eps, false);
}

NormResult rmsNorm(const Tensor& x, const Tensor& weight, double eps) {
  return normImpl("rms_norm", x, Tensor(), weight, Tensor(), eps, true);
}

NormGrads layerNormBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const NormResult& saved,
                            bool needWeight, bool needBias, const Tensor& gextra,
                            std::optional<DType> paramGrads) {
  return normBackwardImpl(gy, x, weight, saved, needWeight, needBias, false, gextra, paramGrads);
}

NormGrads rmsNormBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const NormResult& saved,
                          bool needWeight, std::optional<DType> paramGrads) {
  return normBackwardImpl(gy, x, weight, saved, needWeight, false, true, Tensor(), paramGrads);
}

}  // namespace strata::ops
