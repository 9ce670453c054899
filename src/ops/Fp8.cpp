// FP8 front ends (NOTE [FP8 training] in autograd/Fp8.h): the cast with its amax, the FP8 GEMM through the
// GEMM kernel's FP8 operands, and delayed scaling's update.
#include <cstdlib>
#include <string>

#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {
namespace {

void checkSlot(const char* what, const Tensor& t, Device device) {
  STRATA_CHECK(t.defined() && t.numel() == 1 && t.dtype() == DType::F32 && t.device() == device,
               "{}: expected a one-element fp32 tensor on {}", what, toString(device));
}

}  // namespace

Fp8Codes fp8Cast(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax, bool plain,
                 bool transposed) {
  return fp8CastFused(x, Fp8Prologue::None, Tensor(), format, scale, amax, plain, transposed);
}

Fp8Codes fp8CastFused(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format,
                      const Tensor& scale, const Tensor& amax, bool plain, bool transposed,
                      const Tensor& columnSums) {
  STRATA_CHECK(x.dim() == 2 && isFloating(x.dtype()), "fp8Cast: x must be a floating [rows, cols], got {} {}",
               x.dtype(), toString(x.shape()));
  checkSlot("fp8Cast scale", scale, x.device());
  checkSlot("fp8Cast amax", amax, x.device());
  bool withAux = prologue == Fp8Prologue::GeluTanhBackward;
  STRATA_CHECK(!withAux || (aux.defined() && aux.shape() == x.shape() && aux.dtype() == x.dtype() &&
                            aux.device() == x.device()),
               "fp8CastFused: the GELU's backward needs its input as aux, of x's shape, dtype and device");
  STRATA_CHECK(
      !columnSums.defined() || (columnSums.dtype() == DType::F32 && columnSums.isContiguous() &&
                                columnSums.numel() == x.size(1) && columnSums.device() == x.device()),
      "fp8CastFused: the column sums are a contiguous fp32 [{}] on x's device", x.size(1));
  Tensor in = contiguous(x), a = withAux ? contiguous(aux) : Tensor();
  int64_t rows = in.size(0), cols = in.size(1);
  Fp8Codes out;
  if (plain) out.plain = Tensor::empty({rows, cols}, DType::U8, x.device());
  if (transposed) out.transposed = Tensor::empty({cols, rows}, DType::U8, x.device());
  if (columnSums.defined()) columnSums.storage()->bumpVersion();
  if (in.numel() == 0) {
    if (columnSums.defined()) fill(columnSums, 0.0);
    return out;
  }
  amax.storage()->bumpVersion();
  auto cast = kernel<Fp8CastKernel>("fp8Cast", x.device());
  if (cast(in, prologue, a, format, scale, amax, out.plain, out.transposed, columnSums)) return out;
  // Composed where the device's kernel does not fuse these at this shape.
  Tensor v = prologue == Fp8Prologue::GeluTanh           ? geluTanh(in)
             : prologue == Fp8Prologue::GeluTanhBackward ? geluTanhBackward(in, a)
                                                         : in;
  STRATA_CHECK(cast(v, Fp8Prologue::None, Tensor(), format, scale, amax, out.plain, out.transposed, Tensor()),
               "fp8Cast: the {} kernel cast nothing", toString(x.device()));
  if (columnSums.defined()) copy(columnSums, sum(v, {0}, false, DType::F32));
  return out;
}

void fp8MatmulInto(const Tensor& out, const Tensor& a, Fp8Format formatA, const Tensor& scaleA,
                   const Tensor& b, Fp8Format formatB, const Tensor& scaleB, const Tensor& bias,
                   bool accumulate, bool fastAccumulate) {
  STRATA_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.dtype() == DType::U8 &&
                   b.dtype() == DType::U8 && a.size(1) == b.size(1) &&
                   out.shape() == Shape({a.size(0), b.size(0)}) && a.isContiguous() && b.isContiguous() &&
                   out.isContiguous(),
               "fp8MatmulInto: {} = {} @ {}^T does not fit (u8 codes, contiguous)", toString(out.shape()),
               toString(a.shape()), toString(b.shape()));
  STRATA_CHECK(out.dtype() == DType::BF16 || out.dtype() == DType::F32,
               "fp8MatmulInto: the output is bf16 or fp32, not {}", out.dtype());
  STRATA_CHECK(!(formatA == Fp8Format::E5M2 && formatB == Fp8Format::E5M2),
               "fp8MatmulInto: E5M2 x E5M2 has no tensor-core kernel");
  STRATA_CHECK(a.device() == out.device() && b.device() == out.device(), "fp8MatmulInto: devices differ");
  checkSlot("fp8MatmulInto scaleA", scaleA, out.device());
  checkSlot("fp8MatmulInto scaleB", scaleB, out.device());
  STRATA_CHECK(!bias.defined() || (!accumulate && bias.shape() == Shape({out.size(1)}) &&
                                   bias.dtype() == out.dtype() && bias.isContiguous()),
               "fp8MatmulInto: the bias must be [{}] of the output's dtype, and not accumulated",
               out.size(1));
  int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  if (out.numel() == 0) return;
  out.storage()->bumpVersion();
  GemmArgs g;
  g.device = out.device();
  g.dtype = DType::U8;
  g.outDtype = out.dtype();
  g.a = a.data();
  g.b = b.data();
  g.c = out.data();
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = k;
  g.ldc = n;
  g.transB = true;
  g.beta = accumulate ? 1.0f : 0.0f;
  g.fp8A = formatA;
  g.fp8B = formatB;
  g.scaleA = static_cast<const float*>(scaleA.data());
  g.scaleB = static_cast<const float*>(scaleB.data());
  // cuBLASLt's FP8 epilogue takes a bf16 bias only, so an fp32 output adds its bias after the product.
  g.bias = bias.defined() && out.dtype() == DType::BF16 ? bias.data() : nullptr;
  g.fp8FastAccumulate = fastAccumulate;
  bool ran = kernel<GemmKernel>("gemm", out.device())(g);
  if (ran && bias.defined() && !g.bias) addInPlace(out, detail::expandRaw(bias, out.shape()));
  if (!ran && g.bias) {
    // The backend had no FP8 kernel with the bias epilogue: the product, then the bias.
    g.bias = nullptr;
    ran = kernel<GemmKernel>("gemm", out.device())(g);
    if (ran) addInPlace(out, detail::expandRaw(bias, out.shape()));
  }
  STRATA_CHECK(ran, "fp8MatmulInto: no FP8 GEMM for [{} x {}] @ [{} x {}]", m, k, k, n);
}

bool fp8FastForward() {
  const char* v = std::getenv("STRATA_FP8_FAST_ACCUM");
  return v && std::string(v) == "1";
}

void fp8UpdateScales(const std::vector<Tensor>& states, int64_t history, int64_t position, int margin,
                     bool mostRecent) {
  STRATA_CHECK(history > 0 && position >= 0 && position < history && margin >= 0,
               "fp8UpdateScales: history {} position {} margin {}", history, position, margin);
  if (states.empty()) return;
  for (const Tensor& s : states) {
    STRATA_CHECK(s.dtype() == DType::F32 && s.isContiguous() && s.numel() == fp8StateElements(history) &&
                     s.device() == states[0].device(),
                 "fp8UpdateScales: each state is a contiguous fp32 [{}] on one device",
                 fp8StateElements(history));
    s.storage()->bumpVersion();
  }
  kernel<Fp8UpdateScalesKernel>("fp8UpdateScales", states[0].device())(states, history, position, margin,
                                                                       mostRecent);
}

}  // namespace strata::ops
