// Front ends of the elementwise ops: check, broadcast, allocate, dispatch by op name.
#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {

Tensor map(const char* op, const std::vector<Tensor>& inputs, double a, double b) {
  STRATA_CHECK(!inputs.empty(), "{}: no inputs", op);
  Shape shape;
  const Tensor& first = inputs.back();  // for `where` the condition comes first and may have another dtype
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    STRATA_CHECK(t.defined(), "{}: input {} is undefined", op, i);
    STRATA_CHECK(t.device() == first.device(), "{}: inputs on different devices ({} and {})", op,
                 toString(t.device()), toString(first.device()));
    shape = i == 0 ? t.shape() : broadcastShapes(shape, t.shape());
  }
  STRATA_CHECK(isFloating(first.dtype()), "{}: floating inputs required, got {}", op, first.dtype());
  std::vector<Tensor> expanded;
  expanded.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i];
    if (t.dtype() != first.dtype()) {
      STRATA_CHECK(std::string(op) == "where" && i == 0, "{}: dtypes differ ({} and {})", op, t.dtype(),
                   first.dtype());
      t = to(t, t.device(), first.dtype());
    }
    expanded.push_back(t.shape() == shape ? t : detail::expandRaw(t, shape));
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  if (out.numel() > 0) kernel<MapKernel>(op, out.device())(out, expanded, ScalarArgs{a, b});
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return map("add", {a, b});
}
void addInPlace(const Tensor& dst, const Tensor& src) {
  STRATA_CHECK(dst.defined() && src.defined(), "addInPlace: undefined tensor");
  STRATA_CHECK(dst.shape() == src.shape(), "addInPlace: shapes differ ({} and {})", toString(dst.shape()),
               toString(src.shape()));
  STRATA_CHECK(dst.dtype() == src.dtype(), "addInPlace: dtypes differ ({} and {})", dst.dtype(), src.dtype());
  STRATA_CHECK(dst.device() == src.device(), "addInPlace: devices differ ({} and {})", toString(dst.device()),
               toString(src.device()));
  STRATA_CHECK(isFloating(dst.dtype()), "addInPlace: floating tensors required, got {}", dst.dtype());
  STRATA_CHECK(dst.isContiguous(), "addInPlace: the destination must be contiguous");
  if (dst.numel() == 0) return;
  dst.storage()->bumpVersion();
  // The map kernels compute out[i] from the inputs' element i alone, so out may be input 0 itself.
  kernel<MapKernel>("add", dst.device())(dst, {dst, src}, ScalarArgs{});
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return map("sub", {a, b});
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return map("mul", {a, b});
}
Tensor div(const Tensor& a, const Tensor& b) {
  return map("div", {a, b});
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return map("maximum", {a, b});
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return map("eq", {a, b});
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return map("gt", {a, b});
}
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.dtype() == b.dtype(), "where: dtypes differ ({} and {})", a.dtype(), b.dtype());
  return map("where", {cond, a, b});
}
Tensor neg(const Tensor& x) {
  return map("neg", {x});
}
Tensor exp(const Tensor& x) {
  return map("exp", {x});
}
Tensor log(const Tensor& x) {
  return map("log", {x});
}
Tensor sqrt(const Tensor& x) {
  return map("sqrt", {x});
}
Tensor rsqrt(const Tensor& x) {
  return map("rsqrt", {x});
}
Tensor tanh(const Tensor& x) {
  return map("tanh", {x});
}
Tensor sigmoid(const Tensor& x) {
  return map("sigmoid", {x});
}
Tensor relu(const Tensor& x) {
  return map("relu", {x});
}
Tensor silu(const Tensor& x) {
  return map("silu", {x});
}
Tensor geluTanh(const Tensor& x) {
  return map("gelu_tanh", {x});
}
Tensor geluErf(const Tensor& x) {
  return map("gelu_erf", {x});
}
Tensor pow(const Tensor& x, double exponent) {
  return map("pow", {x}, exponent);
}
Tensor affine(const Tensor& x, double scale, double shift) {
  return map("affine", {x}, scale, shift);
}
Tensor reluBackward(const Tensor& g, const Tensor& x) {
  return map("relu_backward", {g, x});
}
Tensor siluBackward(const Tensor& g, const Tensor& x) {
  return map("silu_backward", {g, x});
}
Tensor geluTanhBackward(const Tensor& g, const Tensor& x) {
  return map("gelu_tanh_backward", {g, x});
}
Tensor geluErfBackward(const Tensor& g, const Tensor& x) {
  return map("gelu_erf_backward", {g, x});
}
Tensor tanhBackward(const Tensor& g, const Tensor& y) {
  return map("tanh_backward", {g, y});
}
Tensor sigmoidBackward(const Tensor& g, const Tensor& y) {
  return map("sigmoid_backward", {g, y});
}
Tensor powBackward(const Tensor& g, const Tensor& x, double exponent) {
  return map("pow_backward", {g, x}, exponent);
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  STRATA_CHECK(p >= 0.0 && p < 1.0, "dropout: probability must be in [0, 1), got {}", p);
  Tensor in = contiguous(x);
  Tensor out = emptyLike(in);
  if (out.numel() > 0) kernel<DropoutKernel>("dropout", x.device())(in, out, p, seed, offset);
  return out;
}

}  // namespace strata::ops
