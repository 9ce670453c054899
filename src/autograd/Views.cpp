// The differentiable view and conversion methods of Tensor (declared in core/Tensor.h).
#include "strata/autograd/GradMode.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::Grads;
using autograd::recordFunction;

namespace {

// g reshaped to `shape`: a view when g's strides allow, else a copy.
Tensor reshapeRaw(const Tensor& g, const Shape& shape) {
  Shape st = detail::computeViewStrides(g.shape(), g.strides(), detail::inferShape(shape, g.numel()));
  if (!st.empty() || shape.empty()) return detail::viewRaw(g, shape);
  return detail::viewRaw(ops::contiguous(g), shape);
}

Tensor recordView(const char* name, const Tensor& in, Tensor out) {
  Shape inShape = in.shape();
  recordFunction(name, {in}, {out}, [inShape](const Grads& g) { return Grads{reshapeRaw(g[0], inShape)}; });
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  return recordView("ViewBackward", *this, detail::viewRaw(*this, shape));
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape target = detail::inferShape(shape, numel());
  Shape st = detail::computeViewStrides(this->shape(), strides(), target);
  if (!st.empty() || target.empty()) return view(target);
  return contiguous().view(target);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  Tensor out = detail::permuteRaw(*this, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[size_t(wrapDim(dims[i], dim(), "permute"))] = int64_t(i);
  recordFunction("PermuteBackward", {*this}, {out},
                 [inverse](const Grads& g) { return Grads{detail::permuteRaw(g[0], inverse)}; });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> perm(static_cast<size_t>(dim()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int64_t(i);
  std::swap(perm[size_t(wrapDim(d0, dim(), "transpose"))], perm[size_t(wrapDim(d1, dim(), "transpose"))]);
  return permute(perm);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  Tensor out = detail::narrowRaw(*this, d, start, length);
  int64_t dd = wrapDim(d, dim(), "narrow");
  int64_t st = start < 0 ? start + size(dd) : start;
  Shape inShape = shape();
  DType dt = dtype();
  Device dev = device();
  recordFunction("NarrowBackward", {*this}, {out}, [=](const Grads& g) {
    Tensor full = ops::zeros(inShape, dt, dev);
    ops::copy(detail::narrowRaw(full, dd, st, length), g[0]);
    return Grads{full};
  });
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  Tensor out = detail::expandRaw(*this, shape);
  Shape inShape = this->shape();
  recordFunction("ExpandBackward", {*this}, {out},
                 [inShape](const Grads& g) { return Grads{ops::sumTo(g[0], inShape)}; });
  return out;
}

Tensor Tensor::squeeze(int64_t d) const {
  return recordView("SqueezeBackward", *this, detail::squeezeRaw(*this, d));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  return recordView("UnsqueezeBackward", *this, detail::unsqueezeRaw(*this, d));
}

Tensor Tensor::flatten(int64_t startDim, int64_t endDim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = wrapDim(startDim, dim(), "flatten"), e = wrapDim(endDim, dim(), "flatten");
  Shape target;
  for (int64_t i = 0; i < s; ++i) target.push_back(shape()[size_t(i)]);
  int64_t merged = 1;
  for (int64_t i = s; i <= e; ++i) merged *= shape()[size_t(i)];
  target.push_back(merged);
  for (int64_t i = e + 1; i < dim(); ++i) target.push_back(shape()[size_t(i)]);
  return reshape(target);
}

Tensor Tensor::contiguous() const {
  if (isContiguous()) return *this;
  Tensor out = ops::contiguous(*this);
  recordFunction("ContiguousBackward", {*this}, {out}, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}

Tensor Tensor::to(Device device, DType dtype) const {
  if (device == this->device() && dtype == this->dtype()) return *this;
  Tensor out = ops::to(*this, device, dtype);
  Device fromDevice = this->device();
  DType fromType = this->dtype();
  recordFunction("ToBackward", {*this}, {out},
                 [=](const Grads& g) { return Grads{ops::to(g[0], fromDevice, fromType)}; });
  return out;
}

Tensor Tensor::to(Device device) const {
  return to(device, dtype());
}
Tensor Tensor::to(DType dtype) const {
  return to(device(), dtype);
}

Tensor Tensor::clone() const {
  Tensor out = ops::emptyLike(*this);
  ops::copy(out, *this);
  recordFunction("CloneBackward", {*this}, {out}, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}

}  // namespace strata
