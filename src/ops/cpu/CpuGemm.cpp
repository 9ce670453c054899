// CPU GEMM through Eigen. f32/f64 map the operands in place; bf16/f16 are widened to f32, multiplied, and
// rounded back. Batches run in parallel (Eigen then runs each product single-threaded); a single large
// product lets Eigen use its own OpenMP threads.
#include <Eigen/Core>
#include <vector>

#include "../ElementwiseFunctors.h"
#include "CpuKernels.h"
#include "strata/core/Fp8.h"

namespace strata::ops::cpu {
namespace {

template <class S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using ConstMap = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>;
template <class S>
using MutMap = Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>;

template <class S>
void gemmOne(const GemmArgs& g, const S* a, const S* b, S* c) {
  int64_t aRows = g.transA ? g.k : g.m, aCols = g.transA ? g.m : g.k;
  int64_t bRows = g.transB ? g.n : g.k, bCols = g.transB ? g.k : g.n;
  ConstMap<S> A(a, aRows, aCols, Eigen::OuterStride<>(g.lda));
  ConstMap<S> B(b, bRows, bCols, Eigen::OuterStride<>(g.ldb));
  MutMap<S> C(c, g.m, g.n, Eigen::OuterStride<>(g.ldc));
  S alpha = S(g.alpha);
  if (g.beta == 0.0f) {
    if (!g.transA && !g.transB)
      C.noalias() = alpha * (A * B);
    else if (g.transA && !g.transB)
      C.noalias() = alpha * (A.transpose() * B);
    else if (!g.transA && g.transB)
      C.noalias() = alpha * (A * B.transpose());
    else
      C.noalias() = alpha * (A.transpose() * B.transpose());
  } else {
    C *= S(g.beta);
    if (!g.transA && !g.transB)
      C.noalias() += alpha * (A * B);
    else if (g.transA && !g.transB)
      C.noalias() += alpha * (A.transpose() * B);
    else if (!g.transA && g.transB)
      C.noalias() += alpha * (A * B.transpose());
    else
      C.noalias() += alpha * (A.transpose() * B.transpose());
  }
}

template <class S>
void gemmBatched(const GemmArgs& g, const S* a, const S* b, S* c) {
  if (g.batch == 1) {
    gemmOne(g, a, b, c);
    return;
  }
#pragma omp parallel for
  for (int64_t i = 0; i < g.batch; ++i) gemmOne(g, a + i * g.strideA, b + i * g.strideB, c + i * g.strideC);
}

// The epilogues of GemmArgs over C held in the compute type S (row r, column col at c[r * ldc + col]); T is
// the storage type of bias and aux, G that of biasGrad; b is op(B)'s storage in S.
template <class S, class T, class G>
void epilogue(const GemmArgs& g, S* c, const S* b) {
  const T* bias = static_cast<const T*>(g.bias);
  T* aux = static_cast<T*>(g.aux);
  fn::GeluTanh gelu{ScalarArgs{}};
  fn::GeluTanhBackward dgelu{ScalarArgs{}};
  if (g.bias || g.gelu || g.dgelu) {
#pragma omp parallel for if (g.m * g.n > kParallelGrain)
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t col = 0; col < g.n; ++col) {
        S v = c[r * g.ldc + col];
        if (bias) v += S(bias[col]);
        if (g.gelu) {
          if (aux) aux[r * g.ldAux + col] = T(v);
          v = gelu(v);
        }
        if (g.dgelu) v = dgelu(v, S(aux[r * g.ldAux + col]));
        c[r * g.ldc + col] = v;
      }
  }
  if (g.biasGrad) {
    G* out = static_cast<G*>(g.biasGrad);
#pragma omp parallel for if (g.k * g.n > kParallelGrain)
    for (int64_t col = 0; col < g.n; ++col) {
      S sum = 0;
      for (int64_t i = 0; i < g.k; ++i) sum += g.transB ? b[col * g.ldb + i] : b[i * g.ldb + col];
      out[col] = G(sum);
    }
  }
}

// Extent in elements of one strided batch of a row-major matrix with `rows` rows.
int64_t span(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return (batch - 1) * stride + rows * ld;
}

template <class H>
void gemmWidened(const GemmArgs& g) {
  int64_t aRows = g.transA ? g.k : g.m, bRows = g.transB ? g.n : g.k;
  int64_t na = span(g.batch, g.strideA, aRows, g.lda), nb = span(g.batch, g.strideB, bRows, g.ldb);
  int64_t nc = span(g.batch, g.strideC, g.m, g.ldc);
  std::vector<float> a(static_cast<size_t>(na)), b(static_cast<size_t>(nb)), c(static_cast<size_t>(nc), 0.0f);
  const H* ah = static_cast<const H*>(g.a);
  const H* bh = static_cast<const H*>(g.b);
  bool wide = g.outDtype && *g.outDtype == DType::F32;  // fp32 C from 16-bit operands
  H* ch = static_cast<H*>(g.c);
  float* cf = static_cast<float*>(g.c);
  for (int64_t i = 0; i < na; ++i) a[size_t(i)] = float(ah[i]);
  for (int64_t i = 0; i < nb; ++i) b[size_t(i)] = float(bh[i]);
  if (g.beta != 0.0f)
    for (int64_t i = 0; i < nc; ++i) c[size_t(i)] = wide ? cf[i] : float(ch[i]);
  gemmBatched<float>(g, a.data(), b.data(), c.data());
  if (wide)
    epilogue<float, H, float>(g, c.data(), b.data());
  else
    epilogue<float, H, H>(g, c.data(), b.data());
  // Write back only the elements of C (rows may have padding between them when ldc > n).
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t col = 0; col < g.n; ++col) {
        int64_t idx = bi * g.strideC + r * g.ldc + col;
        if (wide)
          cf[idx] = c[size_t(idx)];
        else
          ch[idx] = H(c[size_t(idx)]);
      }
}

// FP8 operands (GemmArgs::fp8A/fp8B): the codes decoded exactly to fp32, multiplied in fp32 and scaled by
// alpha scaleA scaleB, as cuBLASLt does on the device (up to the order of the sums). T is C's dtype.
template <class T>
void gemmFp8(const GemmArgs& g) {
  std::vector<float> a(size_t(g.m * g.k)), b(size_t(g.n * g.k)), c(size_t(g.m * g.n), 0.0f);
  const auto* ac = static_cast<const uint8_t*>(g.a);
  const auto* bc = static_cast<const uint8_t*>(g.b);
  for (int64_t r = 0; r < g.m; ++r)
    for (int64_t i = 0; i < g.k; ++i) a[size_t(r * g.k + i)] = fp8ToFloat(ac[r * g.lda + i], *g.fp8A);
  for (int64_t r = 0; r < g.n; ++r)
    for (int64_t i = 0; i < g.k; ++i) b[size_t(r * g.k + i)] = fp8ToFloat(bc[r * g.ldb + i], *g.fp8B);
  T* out = static_cast<T*>(g.c);
  if (g.beta != 0.0f)
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t col = 0; col < g.n; ++col) c[size_t(r * g.n + col)] = float(out[r * g.ldc + col]);
  GemmArgs f = g;
  f.dtype = DType::F32;
  f.lda = f.ldb = g.k;
  f.ldc = g.n;
  f.alpha = g.alpha * *g.scaleA * *g.scaleB;
  gemmBatched<float>(f, a.data(), b.data(), c.data());
  epilogue<float, T, float>(f, c.data(), b.data());
  for (int64_t r = 0; r < g.m; ++r)
    for (int64_t col = 0; col < g.n; ++col) out[r * g.ldc + col] = T(c[size_t(r * g.n + col)]);
}

template <class T>
void gemmNative(const GemmArgs& g) {
  gemmBatched(g, static_cast<const T*>(g.a), static_cast<const T*>(g.b), static_cast<T*>(g.c));
  epilogue<T, T, T>(g, static_cast<T*>(g.c), static_cast<const T*>(g.b));
}

bool gemm(const GemmArgs& g) {
  STRATA_CHECK(!g.hasEpilogue() || g.batch == 1, "gemm: epilogues need batch 1");
  if (g.fp8A || g.fp8B) {
    STRATA_CHECK(g.fp8A && g.fp8B && g.dtype == DType::U8 && g.outDtype && !g.transA && g.transB &&
                     g.batch == 1 && !(g.gelu || g.dgelu || g.biasGrad),
                 "gemm: FP8 operands take A [m, k] and B [n, k], batch 1, a bias at most");
    if (*g.outDtype == DType::F32)
      gemmFp8<float>(g);
    else if (*g.outDtype == DType::BF16)
      gemmFp8<BFloat16>(g);
    else
      STRATA_FAIL("gemm: an FP8 product writes bf16 or fp32, not {}", *g.outDtype);
    return true;
  }
  STRATA_CHECK(!(g.gelu && g.dgelu) && (!g.dgelu || g.aux) && (!g.biasGrad || !(g.bias || g.gelu || g.dgelu)),
               "gemm: unsupported epilogue combination");
  STRATA_CHECK(!(g.bias || g.gelu || g.dgelu) || !g.outDtype || *g.outDtype == g.dtype,
               "gemm: a bias or GELU epilogue needs C in the operands' dtype");
  STRATA_CHECK(!g.outDtype || *g.outDtype == g.dtype ||
                   (*g.outDtype == DType::F32 && (g.dtype == DType::BF16 || g.dtype == DType::F16)),
               "gemm: output dtype {} for {} operands is not supported", *g.outDtype, g.dtype);
  switch (g.dtype) {
    case DType::F32:
      gemmNative<float>(g);
      return true;
    case DType::F64:
      gemmNative<double>(g);
      return true;
    case DType::BF16:
      gemmWidened<BFloat16>(g);
      return true;
    case DType::F16:
      gemmWidened<Half>(g);
      return true;
    default:
      STRATA_FAIL("matmul: dtype {} is not supported on the cpu", g.dtype);
  }
}

}  // namespace

void registerGemm(Registry& r) {
  r.add<GemmKernel>("gemm", DeviceType::CPU, &gemm);
}

}  // namespace strata::ops::cpu
