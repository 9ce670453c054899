// Raw tensor ops: no autograd. Each validates its arguments, allocates the result and calls the kernel
// registered for (op, device). The differentiable versions users call are in strata/autograd/Functions.h
// (namespace strata).
#pragma once

#include <cmath>

#include <cstdint>
#include <optional>
#include <vector>

#include "strata/core/Fp8.h"
#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"

namespace strata::ops {

// ---- creation and copies
// ------------------------------------------------------------------------------------------
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::F32,
              Device device = Device::cpu());
// Uniform in [low, high) and normal(mean, std) from the Philox stream of `gen`; the same on every device.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::cpu(),
            double low = 0.0, double high = 1.0);
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::F32, Device device = Device::cpu(),
             double mean = 0.0, double std = 1.0);
Tensor emptyLike(const Tensor& t);
Tensor zerosLike(const Tensor& t);
void fill(const Tensor& t, double value);
// Occupies `device`'s current stream for `microseconds`: on a GPU one thread spins on the global timer, so
// later work on that stream starts only after it; on the CPU (whose streams run work at the call) the calling
// thread waits. A test aid that makes a missing wait between streams show as wrong numbers (NOTE [Comm delay]
// in distributed/Communicator.h).
void spin(Device device, double microseconds);
// dst <- src (same shape; any strides; dtype converted; devices may differ).
void copy(const Tensor& dst, const Tensor& src);
Tensor contiguous(const Tensor& t);
Tensor to(const Tensor& t, Device device, DType dtype);

// ---- elementwise (broadcasting, same floating dtype)
// ---------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
// dst <- dst + src in place, bitwise equal to add(dst, src): same shape, dtype and device; dst contiguous;
// src any strides, not overlapping dst unless it is dst itself. Bumps dst's storage version.
void addInPlace(const Tensor& dst, const Tensor& src);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);  // 1 where equal, 0 elsewhere, in the inputs' dtype
Tensor gt(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // cond != 0 ? a : b
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor geluTanh(const Tensor& x);
Tensor geluErf(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor affine(const Tensor& x, double scale, double shift);  // x * scale + shift
// Gradients of the activations: g * f'(x) (tanh and sigmoid take their output y).
Tensor reluBackward(const Tensor& g, const Tensor& x);
Tensor siluBackward(const Tensor& g, const Tensor& x);
Tensor geluTanhBackward(const Tensor& g, const Tensor& x);
Tensor geluErfBackward(const Tensor& g, const Tensor& x);
Tensor tanhBackward(const Tensor& g, const Tensor& y);
Tensor sigmoidBackward(const Tensor& g, const Tensor& y);
Tensor powBackward(const Tensor& g, const Tensor& x, double exponent);
// Applies a registered elementwise op by name to inputs broadcast to one shape.
Tensor map(const char* op, const std::vector<Tensor>& inputs, double a = 0.0, double b = 0.0);

// ---- reductions
// --------------------------------------------------------------------------------------------------- Empty
// `dims` reduces over all dimensions. Accumulation is in fp32 (fp64 for f64).
// out: the result's dtype when it differs from x's (fp32 sums of bf16/f16 values).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false,
           std::optional<DType> out = std::nullopt);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Sums a broadcast result back to `shape` (the backward of broadcasting).
Tensor sumTo(const Tensor& x, const Shape& shape);

// ---- linear algebra
// ----------------------------------------------------------------------------------------------- a [..., m,
// k] @ b [..., k, n] with broadcast batch dims; 1-D operands are promoted as in NumPy. CUDA: cuBLASLt with
// fp32 accumulation for bf16/f16/f32.
// out: the result's dtype when it differs from the operands' (fp32 from bf16/f16 operands).
Tensor matmul(const Tensor& a, const Tensor& b, std::optional<DType> out = std::nullopt);
// out [M, N] (contiguous) += a [M, K] @ b [K, N]; out may be fp32 with bf16/f16 operands (gradient
// accumulation in the GEMM's epilogue, beta = 1).
void matmulAccumulate(const Tensor& out, const Tensor& a, const Tensor& b);
// out [M, N] (contiguous, e.g. a row slice of a bigger buffer) = a [M, K] @ b [K, N], written in place (beta
// = 0); out may be fp32 with bf16/f16 operands.
void matmulInto(const Tensor& out, const Tensor& a, const Tensor& b);
// x [..., K] @ w [K, N] (+ bias [N], undefined for none) -> [..., N]: one GEMM over the flattened rows, the
// bias added in its epilogue (cuBLASLt BIAS on CUDA) instead of a separate pass.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);
// out = gelu_tanh(x @ w + bias) and pre = x @ w + bias (what the backward needs), from one GEMM (cuBLASLt
// GELU_AUX_BIAS on CUDA). bias may be undefined.
struct LinearGeluResult {
  Tensor out, pre;
};
LinearGeluResult linearGelu(const Tensor& x, const Tensor& w, const Tensor& bias);
// (a [M, K] @ b [K, N]) * gelu_tanh'(pre [M, N]): the gradient at a GELU's input from the GEMM that forms
// the gradient at its output (cuBLASLt DGELU epilogue on CUDA).
Tensor matmulGeluBackward(const Tensor& a, const Tensor& b, const Tensor& pre);
// A Linear's parameter gradients from its input x [..., K] and output gradient gy [..., N] (any leading
// shapes with the same number of rows): weight = x^T gy
// [K, N] and, when withBias, bias = gy summed over rows [N], both in `out` dtype, from one GEMM (cuBLASLt
// BGRADA epilogue on CUDA).
struct LinearParamGrads {
  Tensor weight, bias;
};
LinearParamGrads linearParamGrads(const Tensor& x, const Tensor& gy, DType out, bool withBias);
// The same into an existing weight gradient: `weight` (contiguous [K, N], fp32 or the operands' dtype) is set
// to x^T gy, or has it added when `accumulate` (the GEMM's beta = 1: a parameter's gradient buffer filled by
// micro-batches without a pass of its own). Returns the bias gradient in `biasDtype` when withBias.
Tensor linearParamGradsInto(const Tensor& x, const Tensor& gy, const Tensor& weight, bool accumulate,
                            bool withBias, DType biasDtype);

// ---- FP8 (NOTE [FP8 training] in autograd/Fp8.h; the formats in core/Fp8.h)
// x [rows, cols] (any floating dtype, contiguous rows) as FP8 codes (u8) of x * scale in `format`: `plain`
// [rows, cols] and/or `transposed` [cols, rows] (undefined when not asked), from one pass that also maxes the
// largest finite |x| into amax. scale, amax: fp32 one-element views on x's device (slots of an FP8 state);
// the scale is read on the device, so nothing waits for the host.
struct Fp8Codes {
  Tensor plain, transposed;
};
Fp8Codes fp8Cast(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax, bool plain,
                 bool transposed);
// fp8Cast of v = prologue(x[, aux]) (NOTE [FP8 fused casts] in autograd/Fp8.h): x itself (None),
// geluTanh(x) (GeluTanh), or geluTanhBackward(x, aux) with x the GELU output's gradient and aux (x's shape
// and dtype) its input (GeluTanhBackward); v is rounded to x's dtype, as those ops store it, before the cast
// and the amax see it, so the codes and the amax are the composed ops' bits. With `columnSums` (fp32 [cols],
// overwritten) the columns' sums of v in fp32: in blocks of 64 rows, each summed row by row, the blocks' sums
// then added in order (the same order on every device where the kernel fuses them, ops::sum's elsewhere).
enum class Fp8Prologue : uint8_t { None, GeluTanh, GeluTanhBackward };
Fp8Codes fp8CastFused(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format,
                      const Tensor& scale, const Tensor& amax, bool plain, bool transposed,
                      const Tensor& columnSums = Tensor());
// out [m, n] = scaleA scaleB (a [m, k] @ b [n, k]^T) (+ bias [n] of out's dtype), a and b FP8 codes (u8)
// with k contiguous (cuBLASLt's FP8 layout on Hopper), products accumulated in fp32, written in `out`'s
// dtype (bf16 or fp32; the CPU computes in fp32). scaleA, scaleB: fp32 one-element views (dequantisation
// factors). With `accumulate` the product is added to out (beta 1; no bias). With `fastAccumulate` the
// GPU's kernel may keep its partial sums in the tensor cores' own precision (cuBLASLt FAST_ACCUM).
void fp8MatmulInto(const Tensor& out, const Tensor& a, Fp8Format formatA, const Tensor& scaleA,
                   const Tensor& b, Fp8Format formatB, const Tensor& scaleB, const Tensor& bias,
                   bool accumulate, bool fastAccumulate = false);
// STRATA_FP8_FAST_ACCUM=1: the forward's FP8 products use fastAccumulate (Transformer Engine's default for
// the forward); the gradients' products never do. Read at each call.
bool fp8FastForward();
// Whether a [rows, K] @ [K, N] product can run in FP8: cuBLASLt needs K and every leading dimension a
// multiple of 16, and the backward's products take rows and N as their K.
inline bool fp8Shape(int64_t rows, int64_t K, int64_t N) {
  return rows > 0 && K > 0 && N > 0 && rows % 16 == 0 && K % 16 == 0 && N % 16 == 0;
}
// Delayed scaling's step (NOTE [FP8 training]) over FP8 states, each fp32 [fp8StateElements(history)] laid
// out as core/Fp8.h says: scales and their inverses, then three amax histories. For each of the three, the
// amax is the history's largest (or, with mostRecent, the entry at `position`); the scale becomes
// fp8NextScale(amax) for format E4M3 (the first two) or E5M2 (the third), its inverse follows, and the entry
// at position + 1 (mod history) is zeroed for the next step to record into.
void fp8UpdateScales(const std::vector<Tensor>& states, int64_t history, int64_t position, int margin,
                     bool mostRecent);

// ---- normalisation and softmax (over the last dimension unless given)
// ---------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor logSoftmax(const Tensor& x, int64_t dim = -1);
// y is the forward output (softmax or log-softmax).
Tensor softmaxBackward(const Tensor& y, const Tensor& gy, int64_t dim, bool log);
// Attention probabilities in one pass: softmax over the last dim of scale * x, where x is [..., S_q, S_k]
// and, when causal, key j is hidden from query i if j > i + (S_k - S_q).
Tensor scaledSoftmax(const Tensor& x, double scale, bool causal);
Tensor scaledSoftmaxBackward(const Tensor& y, const Tensor& gy, double scale);

// Parameters have x's dtype, or are fp32 masters with bf16/f16 x (read as they are; their gradients come back
// in fp32).
struct NormResult {
  Tensor y, mean, rstd;  // mean and rstd are fp32 [rows]; mean is undefined for RMSNorm
  Tensor sum;            // x + residual (in x's dtype) when a residual was given: the rows normalised
};
// With `residual`, normalises x + residual in the same pass (a pre-LN block's residual add) and returns that
// sum as well.
NormResult layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                     const Tensor& residual = Tensor());
NormResult rmsNorm(const Tensor& x, const Tensor& weight, double eps);
struct NormGrads {
  Tensor x, weight, bias;
};
// x: the rows that were normalised (the sum, for a fused residual). gextra, if defined, is added to the
// input gradient in the same pass (the gradient reaching those rows through the residual path).
// The weight and bias gradients come in `paramGrads` (default: the weight's dtype).
NormGrads layerNormBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const NormResult& saved,
                            bool needWeight, bool needBias, const Tensor& gextra = Tensor(),
                            std::optional<DType> paramGrads = std::nullopt);
NormGrads rmsNormBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const NormResult& saved,
                          bool needWeight, std::optional<DType> paramGrads = std::nullopt);

// ---- fused attention
// ------------------------------------------------------------------------------------------------
// softmax(scale * q k^T [+ bias] [+ causal mask]) v without materialising the scores. q [B, Sq, H, D], k and
// v [B, Sk, H, D]: views with a contiguous last dim (heads may be interleaved with other data, e.g. slices of
// a packed qkv projection). Causal masking hides key j from query i when j > i + (Sk - Sq). scale 0 means
// 1/sqrt(D). On CUDA: bf16/f16, D of 64, 80 or 128 (flashAttentionSupported says); the CPU kernel is a
// reference for every floating dtype.
// Which fused kernel runs CUDA attention. Auto: cuDNN's where the build has them (the cuDNN frontend's
// headers, STRATA_CUDNN_FRONTEND_DIR) and cuDNN supports the case, else Strata's own; STRATA_ATTENTION=native
// makes Auto take Strata's. Native: Strata's always. Cudnn: cuDNN's where it takes the case, else Strata's
// (FlashAttentionResult::cudnn says which ran). The CPU has one kernel.
enum class AttentionBackend : uint8_t { Auto, Native, Cudnn };
// Whether this build has cuDNN's fused attention.
bool cudnnAttentionBuilt();
// NOTE [Fused attention dropout]: with dropout > 0 the probabilities are dropped as ops::dropout drops a
// [B, H, Sq, Sk] tensor of them with (seed, offset): element (b, h, i, j) is kept when
// dropKeep(seed, offset + ((b * H + h) * Sq + i) * Sk + j, dropThreshold(dropout)) (NOTE [Dropout bits] in
// core/Philox.h: 8 neighbouring keys share one Philox evaluation), and kept ones are scaled by 1 / (1 -
// dropout). That is the mask the composed attention (softmax, then dropout) draws from the same generator
// state, so the two paths agree; nothing is stored, the backward replays it. Strata's kernels only: cuDNN's
// draws its own mask, so dropout never goes to cuDNN.
struct AttentionOptions {
  double scale = 0.0;
  bool causal = false;
  AttentionBackend backend = AttentionBackend::Auto;
  double dropout = 0.0;  // probability of dropping an attention probability, [0, 1)
  uint64_t seed = 0, offset = 0;
  // Added to the scaled scores before the softmax (NOTE [Biased fused attention] in
  // kernels/FlashAttention.cuh): [1 or B, H, Sq, Sk] in the operands' dtype and on their device, any strides
  // (a last dim that is not contiguous is copied first); a leading 1 shares it with the whole batch (T5's
  // relative positions). Undefined for none. The causal mask still applies on top.
  Tensor bias = Tensor();
};
struct FlashAttentionResult {
  Tensor out;   // [B, Sq, H, D] contiguous
  Tensor lse2;  // fp32 (f64 for f64) [B, H, Sq]: log2-domain log-sum-exp of each row, kept for the backward
  bool cudnn = false;  // cuDNN ran the forward, so its backward runs too
  // The forward's dropout and its mask's (seed, offset): the backward must be given the same.
  double dropout = 0.0;
  uint64_t seed = 0, offset = 0;
};
bool flashAttentionSupported(const Tensor& q, const Tensor& k, const Tensor& v);
// Whether `bias` fits fused attention of q [B, Sq, H, D] and k [B, Sk, H, D]: [1 or B, H, Sq, Sk], q's dtype
// and device.
bool flashAttentionBiasFits(const Tensor& bias, const Tensor& q, const Tensor& k);
FlashAttentionResult flashAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options);
// Writes the gradients into dq, dk, dv (preallocated, shaped like q, k, v, contiguous last dim), which may be
// views into one packed buffer. With options.bias, dbias (shaped like the bias, its dtype) receives the
// bias's gradient, summed over the batch where the bias is shared by it; leave it undefined when none is
// wanted.
void flashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                            const FlashAttentionResult& saved, const Tensor& dout, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const AttentionOptions& options,
                            const Tensor& dbias = Tensor());

// ---- layers' kernels
// ---------------------------------------------------------------------------------------------- weight [V,
// C], indices (i32/i64) of any shape -> [..., C].
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor embeddingBackward(const Tensor& gy, const Tensor& indices, int64_t numEmbeddings, DType dtype);
// Adds the rows of gy [N, C] into out [V, C] (contiguous, fp32 for 16-bit gy, else gy's dtype) at indices
// [N]; with !accumulate, out is zeroed first.
void embeddingBackwardInto(const Tensor& gy, const Tensor& indices, const Tensor& out, bool accumulate);

struct CrossEntropyResult {
  Tensor loss;     // fp32 scalar: mean over targets that are not ignore_index
  Tensor lse;      // fp32 [N]: log-sum-exp per row, all the backward keeps besides the logits
  Tensor count;    // fp32 [1]: number of targets counted, at least 1 (the mean's divisor)
  Tensor counted;  // fp32 []: number of targets counted (0 when every target is ignore_index)
};
// logits [N, V], target i64/i32 [N].
CrossEntropyResult crossEntropy(const Tensor& logits, const Tensor& target, int64_t ignoreIndex = -100);
Tensor crossEntropyBackward(const Tensor& gradLoss, const Tensor& logits, const Tensor& target,
                            const CrossEntropyResult& saved, int64_t ignoreIndex = -100);
// The forward and, with `grad`, the unnormalised backward in one pass over logits [N, V] (contiguous), for
// callers that consume the gradient at once (the fused LM head): fills rowLoss and valid ([N], contiguous,
// statistics dtype; the loss is 0 and valid 0 where target is ignore_index) and, with `grad`, overwrites the
// logits with softmax - one_hot(target) (zero rows where ignored). No [N, V] buffer is allocated.
void crossEntropyInPlace(const Tensor& logits, const Tensor& target, const Tensor& rowLoss,
                         const Tensor& valid, bool grad, int64_t ignoreIndex = -100);

// Zeroes each element with probability p (to 1/65536: NOTE [Dropout bits] in core/Philox.h) and scales the
// rest by 1/(1-p). The mask is a function of (seed, offset + element index), so it is the same on every
// device and can be replayed for the backward.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);

// ---- optimizer updates
// -------------------------------------------------------------------------------------------- AdamW
// (decoupled weight decay) over a list of tensors on one device, in place. param: fp32, contiguous; m and v:
// contiguous, both fp32 or both bf16 (optimizer.moments_dtype: widened exactly as they are read, the update
// computed in fp32 as with fp32 moments, and the new m and v rounded to nearest even as they are written, as
// BFloat16(float) rounds; a NaN stays a NaN); grad: contiguous fp32, bf16 or f16 (16-bit gradient buffers,
// precision.grad_accum_dtype: widened exactly as they are read, so the update equals the one from the
// widened fp32 gradient). One fused launch on the
// GPU. `copy` (optional): a contiguous bf16, f16 or f32 tensor of param's size that receives the updated
// param rounded to its dtype in the same pass (the 16-bit parameter whose fp32 master `param` is). Bumps the
// storage versions of param and copy.
//
// NOTE [AdamW bits]: the CPU kernels (every path) and the GPU kernel give the same bits for the same inputs.
// They run one sequence of IEEE operations (products not contracted into fused multiply-adds except where
// the sequence has one; correctly rounded division and square root; round-to-nearest-even to 16 bits, for
// the copy and for bf16 m and v), and the host computes the constants for both (adamwDecayFactor, 1 / bias
// corrections, 1 - beta). So a chunk's update may run on either side and training does not depend on which
// (the pipelined optimizer splits the host-resident state between them by their speed).
struct AdamWTensors {
  Tensor param, grad, m, v;
  float weightDecay = 0.0f;
  Tensor copy;
};
struct AdamWHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float biasCorrection1 = 1, biasCorrection2 = 1;  // 1 - beta^t
};
// The factor a parameter is multiplied by before the step (decoupled weight decay), 1 - lr * weightDecay, as
// every AdamW kernel takes it: one fused multiply-add on the host (NOTE [AdamW bits]).
inline float adamwDecayFactor(float lr, float weightDecay) {
  return std::fma(-lr, weightDecay, 1.0f);
}
// gradScale: fp32 [1] on the device that multiplies every gradient (clipping coefficient), or undefined
// for 1.
// Sum of squares of every element of every tensor (fp32, contiguous, one device) as an fp32 scalar on that
// device: the global gradient norm's reduction in one launch, deterministic (no atomics).
Tensor sumOfSquares(const std::vector<Tensor>& tensors);
// The same reduction in two halves, for terms taken at different times (NOTE [Gradient homes] in
// zero/GradientReducer.h): sumOfSquaresParts gives the backend's partial sums of `tensors` (a flat tensor on
// their device whose dtype and length are the backend's: one fp64 sum per tensor on the CPU, one fp32 sum
// per block on the GPU), and sumParts adds lists of them as sumOfSquares adds the concatenated tensors:
// sumParts({sumOfSquaresParts(a), sumOfSquaresParts(b)}) equals sumOfSquares(a then b) bit for bit.
Tensor sumOfSquaresParts(const std::vector<Tensor>& tensors);
Tensor sumParts(const std::vector<Tensor>& parts);
void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& hyper,
           const Tensor& gradScale = Tensor());

// Adafactor (Shazeer & Stern 2018, as HF transformers' Adafactor) over a list of tensors on one device, in
// place, with the gradients times `gradScale` (as adamw's). Per set, with g the scaled gradient:
//  1. second moment, at this step's decay beta2: factored (`row` [R] and `col` [C], R * C = numel, the
//     parameter read as an R x C matrix): row_i = beta2 row_i + (1 - beta2) mean_j(g_ij^2 + eps1), col_j
//     likewise over i; else `v` = beta2 v + (1 - beta2) (g^2 + eps1);
//  2. u = g / sqrt(row_i / mean(row) * col_j), or g / sqrt(v);
//  3. clipping: u /= max(1, RMS(u) / clipThreshold) (no clipping when clipThreshold <= 0);
//  4. the step size: lr times max(eps2, RMS(param)) with scaleParameter (RMS before this update), else lr;
//     u *= that step size;
//  5. first moment when `m` is defined (fp32 or bf16): m = beta1 m + (1 - beta1) u, and u = m;
//  6. param = param (1 - step size x weightDecay) - u; `copy` as adamw's.
// param, grad, v, row, col: fp32 contiguous. RMS and mean are per set. The reductions run as separate passes
// (a set's sums are combined in a fixed order: the CPU's results do not depend on its thread count).
struct AdafactorTensors {
  Tensor param, grad;
  Tensor m;         // undefined: no first moment
  Tensor v;         // unfactored second moment (numel), undefined when factored
  Tensor row, col;  // factored second moment, undefined when not
  float weightDecay = 0.0f;
  Tensor copy;
};
struct AdafactorHyper {
  float lr = 0;     // before the parameter scale: an explicit lr, or the relative step
  float beta1 = 0;  // for sets with m
  float beta2 = 0;  // this step's decay, 1 - t^decayRate
  float eps1 = 1e-30f, eps2 = 1e-3f;
  float clipThreshold = 1.0f;
  bool scaleParameter = true;
};
void adafactor(const std::vector<AdafactorTensors>& sets, const AdafactorHyper& hyper,
               const Tensor& gradScale = Tensor());

// ---- joining
// ------------------------------------------------------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

}  // namespace strata::ops
