// Elementwise functors shared by the CPU and CUDA backends, so both compute the same function. Each functor
// is built from the op's ScalarArgs and applied to compute-type values (float for f32/bf16/f16, double for
// f64).
//
// forEachMapOp() is the one list of elementwise ops: each backend walks it to register its kernels, so adding
// an op here adds it everywhere.
#pragma once

#include <math.h>

#include "Kernels.h"
#include "strata/core/Philox.h"

namespace strata::ops::fn {

STRATA_HOST_DEVICE float mExp(float x) {
  return ::expf(x);
}
STRATA_HOST_DEVICE double mExp(double x) {
  return ::exp(x);
}
STRATA_HOST_DEVICE float mLog(float x) {
  return ::logf(x);
}
STRATA_HOST_DEVICE double mLog(double x) {
  return ::log(x);
}
STRATA_HOST_DEVICE float mSqrt(float x) {
  return ::sqrtf(x);
}
STRATA_HOST_DEVICE double mSqrt(double x) {
  return ::sqrt(x);
}
STRATA_HOST_DEVICE float mTanh(float x) {
  return ::tanhf(x);
}
STRATA_HOST_DEVICE double mTanh(double x) {
  return ::tanh(x);
}
STRATA_HOST_DEVICE float mErf(float x) {
  return ::erff(x);
}
STRATA_HOST_DEVICE double mErf(double x) {
  return ::erf(x);
}
STRATA_HOST_DEVICE float mPow(float x, float p) {
  return ::powf(x, p);
}
STRATA_HOST_DEVICE double mPow(double x, double p) {
  return ::pow(x, p);
}

// tanh through one exp: 1 - 2 / (e^{2x} + 1). Cheaper than tanhf (which goes through expm1f); its absolute
// error stays at a few ulps of 1, which is what the GELU approximation needs.
template <class C>
STRATA_HOST_DEVICE C fastTanh(C x) {
  return C(1) - C(2) / (mExp(C(2) * x) + C(1));
}

struct Add {
  explicit Add(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a + b;
  }
};
struct Sub {
  explicit Sub(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a - b;
  }
};
struct Mul {
  explicit Mul(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a * b;
  }
};
struct Div {
  explicit Div(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a / b;
  }
};
struct Maximum {
  explicit Maximum(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a > b ? a : b;
  }
};
struct Eq {
  explicit Eq(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a == b ? C(1) : C(0);
  }
};
struct Gt {
  explicit Gt(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C a, C b) const {
    return a > b ? C(1) : C(0);
  }
};
struct Where {
  explicit Where(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C cond, C a, C b) const {
    return cond != C(0) ? a : b;
  }
};
struct Neg {
  explicit Neg(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return -x;
  }
};
struct Exp {
  explicit Exp(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return mExp(x);
  }
};
struct Log {
  explicit Log(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return mLog(x);
  }
};
struct Sqrt {
  explicit Sqrt(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return mSqrt(x);
  }
};
struct Rsqrt {
  explicit Rsqrt(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return C(1) / mSqrt(x);
  }
};
struct Tanh {
  explicit Tanh(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return mTanh(x);
  }
};
struct Sigmoid {
  explicit Sigmoid(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return C(1) / (C(1) + mExp(-x));
  }
};
struct Relu {
  explicit Relu(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return x > C(0) ? x : C(0);
  }
};
struct Silu {
  explicit Silu(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return x / (C(1) + mExp(-x));
  }
};
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
  explicit GeluTanh(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    C inner = C(0.7978845608028654) * (x + C(0.044715) * x * x * x);
    return C(0.5) * x * (C(1) + fastTanh(inner));
  }
};
struct GeluErf {
  explicit GeluErf(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return C(0.5) * x * (C(1) + mErf(x * C(0.7071067811865476)));
  }
};
struct Pow {
  double p;
  explicit Pow(const ScalarArgs& s) : p(s.a) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return mPow(x, C(p));
  }
};
struct Affine {
  double scale, shift;
  explicit Affine(const ScalarArgs& s) : scale(s.a), shift(s.b) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C x) const {
    return x * C(scale) + C(shift);
  }
};
struct ReluBackward {
  explicit ReluBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C x) const {
    return x > C(0) ? g : C(0);
  }
};
struct SiluBackward {
  explicit SiluBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C x) const {
    C s = C(1) / (C(1) + mExp(-x));
    return g * s * (C(1) + x * (C(1) - s));
  }
};
struct GeluTanhBackward {
  explicit GeluTanhBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C x) const {
    const C k = C(0.7978845608028654);
    C x2 = x * x;
    C t = fastTanh(k * (x + C(0.044715) * x2 * x));
    C dinner = k * (C(1) + C(3 * 0.044715) * x2);
    return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * dinner);
  }
};
struct GeluErfBackward {
  explicit GeluErfBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C x) const {
    C cdf = C(0.5) * (C(1) + mErf(x * C(0.7071067811865476)));
    C pdf = C(0.3989422804014327) * mExp(C(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
struct TanhBackward {
  explicit TanhBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C y) const {
    return g * (C(1) - y * y);
  }
};
struct SigmoidBackward {
  explicit SigmoidBackward(const ScalarArgs&) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C y) const {
    return g * y * (C(1) - y);
  }
};
struct PowBackward {
  double p;
  explicit PowBackward(const ScalarArgs& s) : p(s.a) {}
  template <class C>
  STRATA_HOST_DEVICE C operator()(C g, C x) const {
    return g * C(p) * mPow(x, C(p - 1));
  }
};

// Calls visit.template operator()<Functor, Arity>(name) for every elementwise op.
template <class Visitor>
void forEachMapOp(Visitor&& visit) {
  visit.template operator()<Add, 2>("add");
  visit.template operator()<Sub, 2>("sub");
  visit.template operator()<Mul, 2>("mul");
  visit.template operator()<Div, 2>("div");
  visit.template operator()<Maximum, 2>("maximum");
  visit.template operator()<Eq, 2>("eq");
  visit.template operator()<Gt, 2>("gt");
  visit.template operator()<Where, 3>("where");
  visit.template operator()<Neg, 1>("neg");
  visit.template operator()<Exp, 1>("exp");
  visit.template operator()<Log, 1>("log");
  visit.template operator()<Sqrt, 1>("sqrt");
  visit.template operator()<Rsqrt, 1>("rsqrt");
  visit.template operator()<Tanh, 1>("tanh");
  visit.template operator()<Sigmoid, 1>("sigmoid");
  visit.template operator()<Relu, 1>("relu");
  visit.template operator()<Silu, 1>("silu");
  visit.template operator()<GeluTanh, 1>("gelu_tanh");
  visit.template operator()<GeluErf, 1>("gelu_erf");
  visit.template operator()<Pow, 1>("pow");
  visit.template operator()<Affine, 1>("affine");
  visit.template operator()<ReluBackward, 2>("relu_backward");
  visit.template operator()<SiluBackward, 2>("silu_backward");
  visit.template operator()<GeluTanhBackward, 2>("gelu_tanh_backward");
  visit.template operator()<GeluErfBackward, 2>("gelu_erf_backward");
  visit.template operator()<TanhBackward, 2>("tanh_backward");
  visit.template operator()<SigmoidBackward, 2>("sigmoid_backward");
  visit.template operator()<PowBackward, 2>("pow_backward");
}

}  // namespace strata::ops::fn
