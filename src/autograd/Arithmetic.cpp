// Differentiable elementwise ops and creation helpers. Each backward sits with its forward.
#include "strata/autograd/Functions.h"
#include "strata/autograd/Node.h"
#include "strata/ops/Ops.h"

namespace strata {

using autograd::Grads;
using autograd::participates;
using autograd::recordFunction;

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return ops::zeros(shape, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return ops::ones(shape, dtype, device);
}
Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  return ops::full(shape, value, dtype, device);
}
Tensor arange(double start, double end, double step, DType dtype, Device device) {
  return ops::arange(start, end, step, dtype, device);
}
Tensor rand(const Shape& shape, DType dtype, Device device, Generator& gen) {
  return ops::rand(shape, gen, dtype, device);
}
Tensor randn(const Shape& shape, DType dtype, Device device, Generator& gen) {
  return ops::randn(shape, gen, dtype, device);
}
void manualSeed(uint64_t seed) {
  defaultGenerator().manualSeed(seed);
}

namespace {
// Saved tensors are detached: a saved tensor never keeps its own graph alive, and never forms a cycle with
// the node that saves it.
Tensor saved(const Tensor& t) {
  return t.defined() ? t.detach() : t;
}
bool need(const Tensor& t) {
  return participates(t);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = ops::add(a, b);
  Shape sa = a.shape(), sb = b.shape();
  bool na = need(a), nb = need(b);
  recordFunction("AddBackward", {a, b}, {out}, [=](const Grads& g) {
    return Grads{na ? ops::sumTo(g[0], sa) : Tensor(), nb ? ops::sumTo(g[0], sb) : Tensor()};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = ops::sub(a, b);
  Shape sa = a.shape(), sb = b.shape();
  bool na = need(a), nb = need(b);
  recordFunction("SubBackward", {a, b}, {out}, [=](const Grads& g) {
    return Grads{na ? ops::sumTo(g[0], sa) : Tensor(), nb ? ops::sumTo(ops::neg(g[0]), sb) : Tensor()};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = ops::mul(a, b);
  bool na = need(a), nb = need(b);
  Tensor sa = nb ? saved(a) : Tensor(), sb = na ? saved(b) : Tensor();
  Shape shA = a.shape(), shB = b.shape();
  recordFunction("MulBackward", {a, b}, {out}, [=](const Grads& g) {
    return Grads{na ? ops::sumTo(ops::mul(g[0], sb), shA) : Tensor(),
                 nb ? ops::sumTo(ops::mul(g[0], sa), shB) : Tensor()};
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = ops::div(a, b);
  bool na = need(a), nb = need(b);
  Tensor sb = saved(b), so = nb ? saved(out) : Tensor();
  Shape shA = a.shape(), shB = b.shape();
  recordFunction("DivBackward", {a, b}, {out}, [=](const Grads& g) {
    Tensor ga = ops::div(g[0], sb);
    return Grads{na ? ops::sumTo(ga, shA) : Tensor(),
                 nb ? ops::sumTo(ops::neg(ops::mul(ga, so)), shB) : Tensor()};
  });
  return out;
}

Tensor add(const Tensor& a, double b) {
  Tensor out = ops::affine(a, 1.0, b);
  recordFunction("AddScalarBackward", {a}, {out}, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, double b) {
  Tensor out = ops::affine(a, b, 0.0);
  recordFunction("MulScalarBackward", {a}, {out},
                 [b](const Grads& g) { return Grads{ops::affine(g[0], b, 0.0)}; });
  return out;
}

Tensor neg(const Tensor& x) {
  Tensor out = ops::neg(x);
  recordFunction("NegBackward", {x}, {out}, [](const Grads& g) { return Grads{ops::neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  Tensor out = ops::exp(x);
  Tensor y = saved(out);
  recordFunction("ExpBackward", {x}, {out}, [y](const Grads& g) { return Grads{ops::mul(g[0], y)}; });
  return out;
}

Tensor log(const Tensor& x) {
  Tensor out = ops::log(x);
  Tensor sx = saved(x);
  recordFunction("LogBackward", {x}, {out}, [sx](const Grads& g) { return Grads{ops::div(g[0], sx)}; });
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = ops::sqrt(x);
  Tensor y = saved(out);
  recordFunction("SqrtBackward", {x}, {out},
                 [y](const Grads& g) { return Grads{ops::div(ops::affine(g[0], 0.5, 0.0), y)}; });
  return out;
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = ops::rsqrt(x);
  Tensor y = saved(out);
  // d/dx x^{-1/2} = -1/2 y^3
  recordFunction("RsqrtBackward", {x}, {out}, [y](const Grads& g) {
    return Grads{ops::mul(ops::affine(g[0], -0.5, 0.0), ops::pow(y, 3.0))};
  });
  return out;
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor out = ops::pow(x, exponent);
  Tensor sx = saved(x);
  recordFunction("PowBackward", {x}, {out},
                 [sx, exponent](const Grads& g) { return Grads{ops::powBackward(g[0], sx, exponent)}; });
  return out;
}

Tensor tanh(const Tensor& x) {
  Tensor out = ops::tanh(x);
  Tensor y = saved(out);
  recordFunction("TanhBackward", {x}, {out},
                 [y](const Grads& g) { return Grads{ops::tanhBackward(g[0], y)}; });
  return out;
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = ops::sigmoid(x);
  Tensor y = saved(out);
  recordFunction("SigmoidBackward", {x}, {out},
                 [y](const Grads& g) { return Grads{ops::sigmoidBackward(g[0], y)}; });
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = ops::relu(x);
  Tensor sx = saved(x);
  recordFunction("ReluBackward", {x}, {out},
                 [sx](const Grads& g) { return Grads{ops::reluBackward(g[0], sx)}; });
  return out;
}

Tensor silu(const Tensor& x) {
  Tensor out = ops::silu(x);
  Tensor sx = saved(x);
  recordFunction("SiluBackward", {x}, {out},
                 [sx](const Grads& g) { return Grads{ops::siluBackward(g[0], sx)}; });
  return out;
}

Tensor gelu(const Tensor& x, GeluApprox approx) {
  bool useTanh = approx == GeluApprox::Tanh;
  Tensor out = useTanh ? ops::geluTanh(x) : ops::geluErf(x);
  Tensor sx = saved(x);
  recordFunction("GeluBackward", {x}, {out}, [sx, useTanh](const Grads& g) {
    return Grads{useTanh ? ops::geluTanhBackward(g[0], sx) : ops::geluErfBackward(g[0], sx)};
  });
  return out;
}

Tensor gatedGelu(const Tensor& gate, const Tensor& up) {
  STRATA_CHECK(gate.shape() == up.shape() && gate.dtype() == up.dtype(),
               "gatedGelu: gate and up must have one shape and dtype, got {} {} and {} {}",
               toString(gate.shape()), gate.dtype(), toString(up.shape()), up.dtype());
  Tensor act = ops::geluTanh(gate);
  Tensor out = ops::mul(act, up);
  bool ng = participates(gate), nu = participates(up);
  // Saves gate and up only: gelu(gate) is recomputed in the backward rather than kept.
  Tensor sg = saved(gate), su = ng ? saved(up) : Tensor();
  recordFunction("GatedGeluBackward", {gate, up}, {out}, [=](const Grads& g) {
    Tensor dGate = ng ? ops::geluTanhBackward(ops::mul(g[0], su), sg) : Tensor();
    Tensor dUp = nu ? ops::mul(g[0], ops::geluTanh(sg)) : Tensor();
    return Grads{dGate, dUp};
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = ops::where(cond, a, b);
  Tensor sc = saved(cond);
  Shape shA = a.shape(), shB = b.shape();
  bool na = need(a), nb = need(b);
  recordFunction("WhereBackward", {Tensor(), a, b}, {out}, [=](const Grads& g) {
    Tensor zero = ops::zeros({}, g[0].dtype(), g[0].device());
    return Grads{Tensor(), na ? ops::sumTo(ops::where(sc, g[0], zero), shA) : Tensor(),
                 nb ? ops::sumTo(ops::where(sc, zero, g[0]), shB) : Tensor()};
  });
  return out;
}

Tensor maskedFill(const Tensor& x, const Tensor& mask, double value) {
  return where(mask, full({}, value, x.dtype(), x.device()), x);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, double b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, double b) {
  return add(a, -b);
}
Tensor operator*(const Tensor& a, double b) {
  return mul(a, b);
}
Tensor operator*(double a, const Tensor& b) {
  return mul(b, a);
}
Tensor operator/(const Tensor& a, double b) {
  return mul(a, 1.0 / b);
}
Tensor operator-(const Tensor& x) {
  return neg(x);
}

}  // namespace strata
