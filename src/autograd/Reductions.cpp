// Differentiable reductions.
#include <cmath>

#include "strata/autograd/Functions.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::Grads;
using autograd::recordFunction;

namespace {

// The reduced-dims shape of x with size 1 kept in place of each reduced dim.
Shape keptShape(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape s = x.shape();
  if (dims.empty()) return Shape(s.size(), 1);
  for (int64_t d : dims) s[size_t(wrapDim(d, x.dim(), "reduce"))] = 1;
  return s;
}

// g (shaped as the reduction's output) viewed with the reduced dims kept as size 1.
Tensor unsqueezeReduced(const Tensor& g, const Shape& kept) {
  return detail::viewRaw(ops::contiguous(g), kept);
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::sum(x, dims, keepdim);
  Shape kept = keptShape(x, dims), inShape = x.shape();
  recordFunction("SumBackward", {x}, {out}, [=](const Grads& g) {
    return Grads{ops::contiguous(detail::expandRaw(unsqueezeReduced(g[0], kept), inShape))};
  });
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::mean(x, dims, keepdim);
  Shape kept = keptShape(x, dims), inShape = x.shape();
  double scale = double(numelOf(kept)) / double(std::max<int64_t>(x.numel(), 1));
  recordFunction("MeanBackward", {x}, {out}, [=](const Grads& g) {
    Tensor gs = ops::affine(unsqueezeReduced(g[0], kept), scale, 0.0);
    return Grads{ops::contiguous(detail::expandRaw(gs, inShape))};
  });
  return out;
}

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = ops::amax(x, dims, keepdim);
  Shape kept = keptShape(x, dims);
  Tensor sx = x.detach(), so = out.detach();
  recordFunction("MaxBackward", {x}, {out}, [=](const Grads& g) {
    // Gradient goes to the positions equal to the maximum, split evenly between ties.
    Tensor mask = ops::eq(sx, unsqueezeReduced(so, kept));
    Tensor count = ops::sum(mask, dims, true);
    Tensor share = ops::div(unsqueezeReduced(g[0], kept), count);
    return Grads{ops::mul(mask, share)};
  });
  return out;
}

Tensor norm(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, double p) {
  STRATA_CHECK(p == 2.0, "norm: only p = 2 is supported, got {}", p);
  return sqrt(sum(x * x, dims, keepdim));
}

}  // namespace strata
