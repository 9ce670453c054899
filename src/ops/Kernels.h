// Kernel signatures of each op family, shared by the front ends (src/ops/*.cpp) and the backends
// (src/ops/cpu, src/ops/cuda). Front ends hand kernels tensors that are already validated, allocated and laid
// out as the signature's comment says; kernels only compute.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "strata/core/Tensor.h"
#include "strata/ops/Ops.h"
#include "strata/ops/Registry.h"

namespace strata::ops {

struct ScalarArgs {
  double a = 0.0;
  double b = 0.0;
};

// out: contiguous. value converted to out's dtype.
using FillKernel = void(const Tensor& out, double value);
// out: contiguous 1-D; out[i] = start + i * step.
using ArangeKernel = void(const Tensor& out, double start, double step);
// out: contiguous floating. uniform: a + (b - a) u; normal: a + b z. Element i uses Philox counter offset +
// i.
using RandomKernel = void(const Tensor& out, uint64_t seed, uint64_t offset, bool normal, double a, double b);
// Keeps the device's current stream busy for `microseconds` (>= 0).
using SpinKernel = void(Device device, double microseconds);
// dst, src: same device and shape, any strides and dtypes.
using CopyKernel = void(const Tensor& dst, const Tensor& src);
// out: contiguous; inputs: already expanded to out's shape (any strides), same dtype as out.
using MapKernel = void(const Tensor& out, const std::vector<Tensor>& inputs, const ScalarArgs& args);
// in: contiguous [A, R, B]; out: contiguous [A, B], dtype of in or f32. Reduces over R.
using ReduceKernel = void(const Tensor& in, const Tensor& out, int64_t A, int64_t R, int64_t B);

// Row-major GEMM: C[m, n] = alpha * op(A) @ op(B) + beta * C, batched with element strides.
// A is stored [m, k] (lda >= k), or [k, m] when transA (lda >= m); likewise B.
struct GemmArgs {
  Device device;
  DType dtype = DType::F32;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool transA = false, transB = false;
  int64_t batch = 1;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  float alpha = 1.0f, beta = 0.0f;
  // Optional [n] vector of C's dtype added to every row of C (a Linear layer's bias), fused into the GEMM's
  // epilogue on CUDA. Requires batch == 1.
  const void* bias = nullptr;
  // C's dtype when it differs from the operands': bf16/f16 operands may write an fp32 C (gradients of fp32
  // master weights straight out of the GEMM). Empty: C has `dtype`.
  std::optional<DType> outDtype;
  // Epilogues (batch 1, alpha 1, beta 0, and C in the operands' dtype, except biasGrad):
  // - gelu: C = gelu_tanh(A B + bias); with aux set, the pre-activation A B + bias is also written to aux.
  // - dgelu: C = (A B) * gelu_tanh'(aux), aux holding a saved pre-activation (the backward of the above).
  // aux is [m, ldAux] in C's dtype.
  bool gelu = false;
  bool dgelu = false;
  void* aux = nullptr;
  int64_t ldAux = 0;
  // - biasGrad: [n] in C's dtype, set to the sums of op(B) over k (with B a Linear's output gradient and A
  //   its input transposed, C and biasGrad are the weight's and the bias's gradients). Alone only.
  void* biasGrad = nullptr;
  // FP8 operands (dtype U8; NOTE [FP8 training] in autograd/Fp8.h): a holds codes of fp8A, b of fp8B, A
  // stored [m, k] and B [n, k] (transA false, transB true: cuBLASLt's FP8 layout), and C = alpha scaleA
  // scaleB (A B) + beta C (+ bias in C's dtype) with scaleA, scaleB fp32 on the device. outDtype is set.
  std::optional<Fp8Format> fp8A, fp8B;
  const float* scaleA = nullptr;
  const float* scaleB = nullptr;
  // CUDA: FP8 products accumulate without periodic promotion to fp32 (faster; the CPU sums in fp32 anyway).
  bool fp8FastAccumulate = false;
  bool hasEpilogue() const { return bias || gelu || dgelu || biasGrad; }
};
// Returns false, having written nothing, when the backend has no kernel for the requested gelu, dgelu or
// biasGrad epilogue (the front end then runs the parts separately); plain products and bias always run.
using GemmKernel = bool(const GemmArgs& args);

// x contiguous [rows, cols] (aux, when the prologue reads it, likewise); plain [rows, cols] and transposed
// [cols, rows] u8 (either may be undefined); scale and amax fp32 one-element tensors on x's device;
// columnSums fp32 [cols] or undefined (ops::fp8CastFused). Returns false, having done nothing, where it does
// not fuse the prologue or the sums at this shape (the front end composes them).
using Fp8CastKernel = bool(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format,
                           const Tensor& scale, const Tensor& amax, const Tensor& plain,
                           const Tensor& transposed, const Tensor& columnSums);
// states: contiguous fp32 [fp8StateElements(history)] each (ops::fp8UpdateScales).
using Fp8UpdateScalesKernel = void(const std::vector<Tensor>& states, int64_t history, int64_t position,
                                   int margin, bool mostRecent);

// Rows of the last dimension: x, y, gy, gx contiguous [N, C].
// softmax(scale * x + mask) per row; with causalRows > 0, row r (query r % causalRows) masks columns
// c > r % causalRows + causalShift. Backward: gx = scale * dsoftmax (masked positions have y = 0, so gx = 0).
struct SoftmaxOptions {
  double scale = 1.0;
  int64_t causalRows = 0;
  int64_t causalShift = 0;
};
using SoftmaxKernel = void(const Tensor& x, const Tensor& y, bool log, const SoftmaxOptions& options);
using SoftmaxBackwardKernel = void(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log,
                                   double scale);
// LayerNorm (rms=false) or RMSNorm (rms=true) over rows. weight/bias [C] may be undefined; they have x's
// dtype or the statistics dtype (fp32 masters with bf16/f16 x). mean/rstd [N] in the statistics dtype (fp32;
// f64 for f64 inputs) (mean undefined for RMSNorm). With residual defined (contiguous like x), the rows
// normalised are sum = x + residual, rounded to x's dtype and written to `sum` as well.
using NormKernel = void(const Tensor& x, const Tensor& residual, const Tensor& sum, const Tensor& weight,
                        const Tensor& bias, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                        double eps, bool rms);
// gw/gb: [C] in the statistics dtype, or undefined when not needed. gextra (contiguous like gx, or
// undefined) is added to gx: the gradient that reaches the norm's input by another path (a residual).
using NormBackwardKernel = void(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                const Tensor& rstd, const Tensor& gextra, const Tensor& gx, const Tensor& gw,
                                const Tensor& gb, bool rms);
// weight [V, C] contiguous, indices contiguous [N] (i32/i64), out [N, C].
using EmbeddingKernel = void(const Tensor& weight, const Tensor& indices, const Tensor& out);
// gw: [V, C] in the statistics dtype, zeroed; gy [N, C].
using EmbeddingBackwardKernel = void(const Tensor& gy, const Tensor& indices, const Tensor& gw);
// logits [N, V] contiguous; target [N]; loss, lse, valid: [N] in the statistics dtype.
using CrossEntropyKernel = void(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                const Tensor& lse, const Tensor& valid, int64_t ignoreIndex);
// scale: [1] on the device, statistics dtype (dLoss / count). glogits like logits.
using CrossEntropyBackwardKernel = void(const Tensor& logits, const Tensor& target, const Tensor& lse,
                                        const Tensor& scale, const Tensor& glogits, int64_t ignoreIndex);
// logits [N, V] contiguous, overwritten by softmax - one_hot(target) when `grad` (zero rows where target is
// ignore_index); loss, valid: [N] in the statistics dtype.
using CrossEntropyInPlaceKernel = void(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                       const Tensor& valid, bool grad, int64_t ignoreIndex);
// x, out contiguous, same dtype.
using DropoutKernel = void(const Tensor& x, const Tensor& out, double p, uint64_t seed, uint64_t offset);

// Fused attention. q [B, Sq, H, D], k/v [B, Sk, H, D], out/dout/dq like q, dk/dv like k: views with a
// contiguous last dim and strides that are multiples of 16 bytes. lse2: [B, H, Sq] contiguous in the
// statistics dtype, the
// log2-domain log-sum-exp of each query's scaled scores (written by the forward, read by the backward).
using FlashAttentionKernel = void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse2, const AttentionOptions& options);
// options.bias, where defined: [Bb, H, Sq, Sk] with a contiguous last dim. dbias, where defined: the
// statistics dtype, contiguous [Bb, H, Sq, Sk], zero on entry; the backward adds each batch's gradient at the
// bias into it (row b of it, or row 0 where Bb is 1).
using FlashAttentionBackwardKernel = void(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& dout, const Tensor& lse2,
                                          const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                          const Tensor& dbias, const AttentionOptions& options);
// cuDNN's fused attention (src/ops/cudnn, where built): the same operands, `lse` holding cuDNN's natural-log
// statistics; false when cuDNN does not support the case (nothing written).
using CudnnAttentionKernel = bool(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const AttentionOptions& options);
using CudnnAttentionBackwardKernel = bool(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& dout, const Tensor& lse,
                                          const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                          const Tensor& dbias, const AttentionOptions& options);

// gradScale: fp32 [1] on the device multiplying every gradient (clipping, loss-scale), or undefined for 1.
// out: fp32 [] on the tensors' device; tensors fp32 contiguous.
using SumOfSquaresKernel = void(const std::vector<Tensor>& tensors, const Tensor& out);
// The same in two halves (ops::sumOfSquaresParts, ops::sumParts): the partial sums, made on the tensors'
// device; and their sum into `out`, in list order.
using SquarePartsKernel = Tensor(const std::vector<Tensor>& tensors);
using SumPartsKernel = void(const std::vector<Tensor>& parts, const Tensor& out);
using AdamWKernel = void(const std::vector<AdamWTensors>& sets, const AdamWHyper& hyper,
                         const Tensor& gradScale);
using AdafactorKernel = void(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& hyper,
                             const Tensor& gradScale);

// Calls fn(TypeTag<int64_t>{}) or fn(TypeTag<int32_t>{}) for an index tensor's dtype.
template <class Fn>
void visitIndexType(DType t, Fn&& fn) {
  if (t == DType::I64)
    fn(TypeTag<int64_t>{});
  else if (t == DType::I32)
    fn(TypeTag<int32_t>{});
  else
    STRATA_FAIL("indices must be i32 or i64, got {}", t);
}

// Backend registration, called once by Registry::instance().
void registerCpuKernels(Registry& registry);
#if STRATA_CUDA
void registerCudaKernels(Registry& registry);
#endif

}  // namespace strata::ops

namespace strata::ops {
// Statistics (norm mean/rstd, losses, fp32 gradient accumulators) are fp32, or f64 for f64 inputs.
inline DType statsDType(DType t) {
  return t == DType::F64 ? DType::F64 : DType::F32;
}
}  // namespace strata::ops
