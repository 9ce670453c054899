// matmul front end: resolves each operand to a (possibly transposed) strided-batched matrix without copying
// when its strides allow, and hands one batched GEMM to the backend.
#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {
namespace {

struct MatrixOperand {
  Tensor tensor;  // keeps the storage alive
  const void* data = nullptr;
  bool trans = false;
  int64_t ld = 0;
  int64_t batchStride = 0;
};

// t has shape batch + [rows, cols]. The batch dims must collapse to one stride (or be absent).
MatrixOperand resolve(const Tensor& tIn, const Shape& batch, int64_t rows, int64_t cols) {
  Shape full = batch;
  full.push_back(rows);
  full.push_back(cols);
  Tensor t = tIn.shape() == full ? tIn : detail::expandRaw(tIn, full);
  int64_t nb = int64_t(batch.size());
  auto layoutOk = [&](const Tensor& x, MatrixOperand& op) {
    int64_t sr = x.strides()[size_t(nb)], sc = x.strides()[size_t(nb + 1)];
    if ((sc == 1 || cols == 1) && (sr >= cols || rows == 1)) {
      op.trans = false;
      op.ld = std::max<int64_t>(rows == 1 ? cols : sr, std::max<int64_t>(cols, 1));
    } else if ((sr == 1 || rows == 1) && (sc >= rows || cols == 1)) {
      op.trans = true;
      op.ld = std::max<int64_t>(cols == 1 ? rows : sc, std::max<int64_t>(rows, 1));
    } else {
      return false;
    }
    // Batch dims must form one arithmetic progression: stride[i] == stride[i+1] * size[i+1] (size-1 dims
    // skip).
    int64_t bstride = 0;
    bool first = true;
    int64_t expect = 0;
    for (int64_t d = nb - 1; d >= 0; --d) {
      int64_t sz = x.shape()[size_t(d)], st = x.strides()[size_t(d)];
      if (sz == 1) continue;
      if (first) {
        bstride = st;
        expect = st * sz;
        first = false;
      } else {
        if (st != expect) return false;
        expect = st * sz;
      }
    }
    op.batchStride = bstride;
    return true;
  };
  MatrixOperand op;
  if (!layoutOk(t, op)) {
    t = contiguous(t);
    bool ok = layoutOk(t, op);
    STRATA_CHECK(ok, "matmul: internal layout error for shape {}", toString(full));
  }
  op.tensor = t;
  op.data = t.data();
  return op;
}

// GEMM arguments for out = A @ B over resolved operands: out is contiguous [batch, m, n] in the operands'
// dtype or a wider one.
GemmArgs gemmArgs(const MatrixOperand& A, const MatrixOperand& B, const Tensor& out, int64_t m, int64_t n,
                  int64_t k, int64_t batch = 1) {
  GemmArgs g;
  g.device = out.device();
  g.dtype = A.tensor.dtype();
  if (out.dtype() != g.dtype) g.outDtype = out.dtype();
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batch;
  g.a = A.data;
  g.transA = A.trans;
  g.lda = A.ld;
  g.strideA = A.batchStride;
  g.b = B.data;
  g.transB = B.trans;
  g.ldb = B.ld;
  g.strideB = B.batchStride;
  g.c = out.data();
  g.ldc = n;
  g.strideC = m * n;
  return g;
}

// x viewed as [rows, cols] with unit column stride, without a copy; undefined when its strides do not allow
// it.
Tensor rowsView(const Tensor& x, int64_t rows, int64_t cols) {
  Shape st = detail::computeViewStrides(x.shape(), x.strides(), {rows, cols});
  return !st.empty() && st[1] == 1 ? detail::asStrided(x, {rows, cols}, st, x.offset()) : Tensor();
}

// x as [rows, cols] with unit column stride: a view when the strides allow, else a contiguous copy.
Tensor rowsOf(const Tensor& x, int64_t rows, int64_t cols) {
  Tensor v = rowsView(x, rows, cols);
  return v.defined() ? v : detail::viewRaw(contiguous(x), {rows, cols});
}

// out [rows, N] = x (rows of K) @ w [K, N] through one GEMM with the epilogue `epilogue` sets (bias, gelu);
// false when the backend has no kernel for that epilogue.
template <class Fn>
bool linearGemm(const Tensor& x, const Tensor& w, const Tensor& out, int64_t rows, Fn&& epilogue) {
  int64_t K = w.size(0), N = w.size(1);
  MatrixOperand A = resolve(rowsOf(x, rows, K), {}, rows, K),
                B = resolve(w, {}, K, N);  // alive until the launch
  GemmArgs g = gemmArgs(A, B, out, rows, N, K);
  epilogue(g);
  return kernel<GemmKernel>("gemm", x.device())(g);
}

}  // namespace

namespace {
// out (+)= a @ b in the GEMM's epilogue: beta 1 accumulates, beta 0 overwrites.
void matmulOut(const char* what, const Tensor& out, const Tensor& a, const Tensor& b, float beta) {
  STRATA_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && a.size(1) == b.size(0) &&
                   out.shape() == Shape({a.size(0), b.size(1)}),
               "{}: {} = {} @ {} does not fit", what, toString(out.shape()), toString(a.shape()),
               toString(b.shape()));
  STRATA_CHECK(out.isContiguous(), "{}: the output must be contiguous", what);
  STRATA_CHECK(a.dtype() == b.dtype(), "{}: operand dtypes differ ({} and {})", what, a.dtype(), b.dtype());
  STRATA_CHECK(a.device() == b.device() && a.device() == out.device(), "{}: devices differ", what);
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (out.numel() == 0) return;
  if (k == 0) {
    if (beta == 0.0f) fill(out, 0.0);
    return;
  }
  out.storage()->bumpVersion();
  MatrixOperand A = resolve(a, {}, m, k), B = resolve(b, {}, k, n);  // alive until the launch
  GemmArgs g = gemmArgs(A, B, out, m, n, k);
  g.beta = beta;
  kernel<GemmKernel>("gemm", a.device())(g);
}
}  // namespace

void matmulAccumulate(const Tensor& out, const Tensor& a, const Tensor& b) {
  matmulOut("matmulAccumulate", out, a, b, 1.0f);
}

void matmulInto(const Tensor& out, const Tensor& a, const Tensor& b) {
  matmulOut("matmulInto", out, a, b, 0.0f);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  if (!bias.defined()) return matmul(x, w);
  STRATA_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(0),
               "linear: x {} does not match weight {} ([in, out])", toString(x.shape()), toString(w.shape()));
  int64_t K = w.size(0), N = w.size(1);
  STRATA_CHECK(bias.shape() == Shape({N}), "linear: bias must be [{}], got {}", N, toString(bias.shape()));
  STRATA_CHECK(x.device() == w.device() && x.device() == bias.device(),
               "linear: operands on different devices");
  STRATA_CHECK(x.dtype() == w.dtype() && x.dtype() == bias.dtype(), "linear: dtypes differ ({}, {}, {})",
               x.dtype(), w.dtype(), bias.dtype());
  int64_t rows = K > 0 ? x.numel() / K : 0;
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  outShape.push_back(N);
  Tensor out = Tensor::empty({rows, N}, x.dtype(), x.device());
  Tensor b = contiguous(bias);
  if (rows > 0 && N > 0 && K == 0) {
    fill(out, 0.0);
    out = add(out, b);
  } else if (rows > 0 && N > 0) {
    linearGemm(x, w, out, rows, [&](GemmArgs& g) { g.bias = b.data(); });
  }
  return detail::viewRaw(out, outShape);
}

LinearGeluResult linearGelu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  STRATA_CHECK(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(0),
               "linearGelu: x {} does not match weight {} ([in, out])", toString(x.shape()),
               toString(w.shape()));
  int64_t K = w.size(0), N = w.size(1);
  STRATA_CHECK(!bias.defined() ||
                   (bias.shape() == Shape({N}) && bias.dtype() == x.dtype() && bias.device() == x.device()),
               "linearGelu: bias must be [{}] of the input's dtype and device", N);
  STRATA_CHECK(x.device() == w.device() && x.dtype() == w.dtype(),
               "linearGelu: x and w differ in device or dtype");
  int64_t rows = K > 0 ? x.numel() / K : 0;
  Shape outShape(x.shape().begin(), x.shape().end() - 1);
  outShape.push_back(N);
  if (rows > 0 && N > 0 && K > 0 && N % 8 == 0) {
    Tensor out = Tensor::empty({rows, N}, x.dtype(), x.device());
    Tensor pre = Tensor::empty({rows, N}, x.dtype(), x.device());
    Tensor b = bias.defined() ? contiguous(bias) : Tensor();
    bool fused = linearGemm(x, w, out, rows, [&](GemmArgs& g) {
      g.bias = b.defined() ? b.data() : nullptr;
      g.gelu = true;
      g.aux = pre.data();
      g.ldAux = N;
    });
    if (fused) return {detail::viewRaw(out, outShape), detail::viewRaw(pre, outShape)};
  }
  Tensor pre = linear(x, w, bias);
  return {geluTanh(pre), pre};
}

Tensor matmulGeluBackward(const Tensor& a, const Tensor& b, const Tensor& pre) {
  STRATA_CHECK(
      a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && pre.shape() == Shape({a.size(0), b.size(1)}),
      "matmulGeluBackward: {} @ {} does not match the pre-activation {}", toString(a.shape()),
      toString(b.shape()), toString(pre.shape()));
  STRATA_CHECK(a.dtype() == b.dtype() && a.dtype() == pre.dtype() && a.device() == b.device() &&
                   a.device() == pre.device(),
               "matmulGeluBackward: operands differ in dtype or device");
  int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m > 0 && n > 0 && k > 0 && n % 8 == 0 && pre.isContiguous()) {
    Tensor out = Tensor::empty({m, n}, a.dtype(), a.device());
    MatrixOperand A = resolve(a, {}, m, k), B = resolve(b, {}, k, n);  // alive until the launch
    GemmArgs g = gemmArgs(A, B, out, m, n, k);
    g.dgelu = true;
    g.aux = const_cast<void*>(pre.data());  // read only: the dgelu epilogue takes aux as an input
    g.ldAux = n;
    if (kernel<GemmKernel>("gemm", a.device())(g)) return out;
  }
  return geluTanhBackward(matmul(a, b), pre);
}

LinearParamGrads linearParamGrads(const Tensor& x, const Tensor& gy, DType out, bool withBias) {
  STRATA_CHECK(x.dim() >= 1 && gy.dim() >= 1 && x.device() == gy.device() && x.dtype() == gy.dtype(),
               "linearParamGrads: x {} and gy {} must match in dtype and device", toString(x.shape()),
               toString(gy.shape()));
  int64_t K = x.size(-1), N = gy.size(-1);
  int64_t rows = x.numel() / std::max<int64_t>(K, 1);
  STRATA_CHECK(gy.numel() == rows * N, "linearParamGrads: x {} and gy {} have different rows",
               toString(x.shape()), toString(gy.shape()));
  Tensor g2 = rowsOf(gy, rows, N);
  Tensor xT = detail::permuteRaw(rowsOf(x, rows, K), {1, 0});
  LinearParamGrads r;
  if (withBias && rows > 0 && K > 0 && N > 0) {
    r.weight = Tensor::empty({K, N}, out, x.device());
    r.bias = Tensor::empty({N}, out, x.device());
    MatrixOperand A = resolve(xT, {}, K, rows), B = resolve(g2, {}, rows, N);  // alive until the launch
    GemmArgs g = gemmArgs(A, B, r.weight, K, N, rows);
    g.biasGrad = r.bias.data();
    if (kernel<GemmKernel>("gemm", x.device())(g)) return r;
  }
  r.weight = matmul(xT, g2, out);
  if (withBias) r.bias = sum(g2, {0}, false, out);
  return r;
}

Tensor linearParamGradsInto(const Tensor& x, const Tensor& gy, const Tensor& weight, bool accumulate,
                            bool withBias, DType biasDtype) {
  STRATA_CHECK(x.dim() >= 1 && gy.dim() >= 1 && x.device() == gy.device() && x.dtype() == gy.dtype(),
               "linearParamGradsInto: x {} and gy {} must match in dtype and device", toString(x.shape()),
               toString(gy.shape()));
  int64_t K = x.size(-1), N = gy.size(-1);
  int64_t rows = x.numel() / std::max<int64_t>(K, 1);
  STRATA_CHECK(gy.numel() == rows * N && weight.shape() == Shape({K, N}) && weight.isContiguous() &&
                   weight.device() == x.device(),
               "linearParamGradsInto: x {} and gy {} do not fit the weight gradient {}", toString(x.shape()),
               toString(gy.shape()), toString(weight.shape()));
  Tensor g2 = rowsOf(gy, rows, N);
  Tensor xT = detail::permuteRaw(rowsOf(x, rows, K), {1, 0});
  if (rows == 0 || K == 0 || N == 0) {
    if (!accumulate) fill(weight, 0.0);
    return withBias ? zeros({N}, biasDtype, x.device()) : Tensor();
  }
  weight.storage()->bumpVersion();
  MatrixOperand A = resolve(xT, {}, K, rows), B = resolve(g2, {}, rows, N);  // alive until the launch
  GemmArgs g = gemmArgs(A, B, weight, K, N, rows);
  Tensor bias;
  if (withBias && !accumulate) {
    // The bias sums come from the GEMM's epilogue, in the weight gradient's dtype.
    bias = Tensor::empty({N}, weight.dtype(), x.device());
    g.biasGrad = bias.data();
    if (kernel<GemmKernel>("gemm", x.device())(g))
      return bias.dtype() == biasDtype ? bias : to(bias, x.device(), biasDtype);
    g.biasGrad = nullptr;
  }
  g.beta = accumulate ? 1.0f : 0.0f;
  kernel<GemmKernel>("gemm", x.device())(g);
  return withBias ? sum(g2, {0}, false, biasDtype) : Tensor();
}

Tensor matmul(const Tensor& aIn, const Tensor& bIn, std::optional<DType> outDtype) {
  STRATA_CHECK(aIn.device() == bIn.device(), "matmul: operands on different devices ({} and {})",
               toString(aIn.device()), toString(bIn.device()));
  STRATA_CHECK(aIn.dtype() == bIn.dtype(), "matmul: dtypes differ ({} and {})", aIn.dtype(), bIn.dtype());
  STRATA_CHECK(aIn.dim() >= 1 && bIn.dim() >= 1, "matmul: operands must have at least one dimension");
  bool squeezeRow = aIn.dim() == 1, squeezeCol = bIn.dim() == 1;
  Tensor a = squeezeRow ? detail::unsqueezeRaw(aIn, 0) : aIn;
  Tensor b = squeezeCol ? detail::unsqueezeRaw(bIn, 1) : bIn;
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  STRATA_CHECK(b.size(-2) == k, "matmul: inner dimensions differ: {} @ {}", toString(aIn.shape()),
               toString(bIn.shape()));
  Shape batchA(a.shape().begin(), a.shape().end() - 2), batchB(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcastShapes(batchA, batchB);
  int64_t nbatch = numelOf(batch);

  Shape outShape = batch;
  outShape.push_back(m);
  outShape.push_back(n);
  Tensor out = Tensor::empty(outShape, outDtype.value_or(a.dtype()), a.device());
  if (out.numel() == 0) return out;
  if (k == 0) {
    fill(out, 0.0);
  } else {
    // A weight shared by every batch entry: fold the batch into the rows of A when A's rows collapse.
    Tensor a2 = batchB.empty() && nbatch > 1 ? rowsView(a, nbatch * m, k) : Tensor();
    // The operands own any contiguous copies resolve() made: they must outlive the launch.
    bool folded = a2.defined();
    MatrixOperand A = folded ? resolve(a2, {}, nbatch * m, k) : resolve(a, batch, m, k);
    MatrixOperand B = folded ? resolve(b, {}, k, n) : resolve(b, batch, k, n);
    GemmArgs g = folded ? gemmArgs(A, B, out, nbatch * m, n, k) : gemmArgs(A, B, out, m, n, k, nbatch);
    kernel<GemmKernel>("gemm", a.device())(g);
  }
  if (squeezeRow) out = detail::squeezeRaw(out, -2);
  if (squeezeCol) out = detail::squeezeRaw(out, -1);
  return out;
}

}  // namespace strata::ops
