// Differentiable ops: the functions models are written with. Each runs the raw op (strata/ops/Ops.h) and,
// when grad mode is on and an input takes part in the graph, records its backward.
#pragma once

#include <array>

#include <cstdint>
#include <vector>

#include "strata/core/Generator.h"
#include "strata/core/Tensor.h"

namespace strata {

namespace autograd {
struct Fp8LinearState;
}  // namespace autograd

// ---- creation (leaves; no graph)
// ----------------------------------------------------------------------------------
Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::F32,
              Device device = Device::cpu());
Tensor rand(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu(),
            Generator& gen = defaultGenerator());
Tensor randn(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu(),
             Generator& gen = defaultGenerator());
// Sets the calling thread's default generator.
void manualSeed(uint64_t seed);

// ---- elementwise (NumPy broadcasting)
// -----------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
enum class GeluApprox { None, Tanh };
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::Tanh);
// T5 v1.1's gated GELU: gelu_tanh(gate) * up, elementwise over one shape (gate = x W_i0, up = x W_i1). The
// backward keeps gate and up and recomputes gelu(gate).
Tensor gatedGelu(const Tensor& gate, const Tensor& up);
// cond != 0 ? a : b (cond any dtype; broadcast).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x where mask == 0, value where mask != 0.
Tensor maskedFill(const Tensor& x, const Tensor& mask, double value);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(const Tensor& a, double b);
Tensor operator-(const Tensor& x);

// ---- reductions (empty dims: all)
// ---------------------------------------------------------------------------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Maximum over dims; the gradient is split evenly between tied maxima.
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// p-norm (p = 2 by default) over dims.
Tensor norm(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false, double p = 2.0);

// ---- linear algebra
// -----------------------------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] @ weight [in, out] + bias [out] (undefined for none): one GEMM with the bias in its epilogue.
// The backward is two GEMMs over the flattened rows; the bias gradient comes out of the weight-gradient GEMM.
// Parameters have x's dtype (the compute dtype); their gradients come in autograd::gradDType, straight into
// their gradient buffers when they have them (NOTE [Gradient buffers] in Node.h).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// A Transformer MLP: gelu_tanh(x @ fcWeight + fcBias) @ projWeight + projBias, weights [in, out], biases
// optional. The GELU runs in the fc GEMM's epilogue and its gradient in the epilogue of the GEMM that forms
// it (cuBLASLt GELU_AUX_BIAS / DGELU on CUDA), and each bias gradient comes out of its weight-gradient GEMM.
// Parameters and gradients as in linear(). With `recomputeGelu` the backward recomputes gelu(pre) for the
// projection's weight gradient instead of keeping it (selective recomputation; on the GPU the recomputed
// values may differ from the GEMM epilogue's in the last bit).
Tensor geluMlp(const Tensor& x, const Tensor& fcWeight, const Tensor& fcBias, const Tensor& projWeight,
               const Tensor& projBias = Tensor(), bool recomputeGelu = false);

// ---- normalisation, softmax, layers
// -------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor logSoftmax(const Tensor& x, int64_t dim = -1);
// softmax(scale * x) over the last dim of [..., S_q, S_k], causally masked when asked (see
// ops::scaledSoftmax).
Tensor scaledSoftmax(const Tensor& x, double scale, bool causal);
// weight/bias in x's dtype or fp32; their gradients come in autograd::gradDType.
Tensor layerNorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// A pre-LN residual step in one pass: sum = x + residual and y = layerNorm(sum). Returns {sum, y}; the
// backward adds sum's gradient into the norm's input gradient in the same pass.
std::array<Tensor, 2> addLayerNorm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                   const Tensor& bias, double eps = 1e-5);
Tensor rmsNorm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
// Rows of weight [V, C] at indices. paddingIdx >= 0: lookups of that id add nothing to weight's gradient (its
// row is still read; torch's padding_idx, which HF's BERT gives its word embeddings).
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t paddingIdx = -1);
// Mean cross-entropy of logits [N, V] against target [N], skipping ignoreIndex. fp32 scalar (f64 for f64
// logits). The backward keeps only the logits and one log-sum-exp per row.
Tensor crossEntropy(const Tensor& logits, const Tensor& target, int64_t ignoreIndex = -100);
// The logits per chunk of linearCrossEntropy's rows by default: 2^28 (512 MiB in bf16) gave the fastest head
// on the H200 at 124M and 1.3B (tools/bench_head.py; 4096 of 16384 rows beat 2341, 8192 and 16384).
inline constexpr int64_t kLinearCrossEntropyChunkLogits = int64_t(1) << 28;
// The rows per chunk linearCrossEntropy takes by default for N rows of V logits: N split evenly into chunks
// of at most kLinearCrossEntropyChunkLogits logits.
inline int64_t linearCrossEntropyChunkRows(int64_t N, int64_t V) {
  int64_t logits = N * V,
          chunks = (logits + kLinearCrossEntropyChunkLogits - 1) / kLinearCrossEntropyChunkLogits;
  chunks = chunks > 1 ? chunks : 1;
  return (N + chunks - 1) / chunks;
}
// Mean cross-entropy of the logits x @ weight^T against target, without the logits of the whole batch: rows
// go through in chunks of about kLinearCrossEntropyChunkLogits logits, each chunk's logits GEMM, loss,
// softmax gradient (written over the logits) and the two gradient GEMMs done before the next, so only one
// chunk's logits exist at a time. x [N, C] in the compute
// dtype; weight [V, C] (a tied embedding) in the compute dtype; target [N]. The gradients are formed
// in the forward (the loss is a scalar) and scaled by the incoming gradient in the backward.
// With `fp8` (precision.fp8_lm_head; NOTE [FP8 training] in autograd/Fp8.h) the three GEMMs of each chunk run
// in FP8 with its scales (x and the weight E4M3, the softmax gradient E5M2), when N, C, V and the chunk's
// rows are multiples of 16 (chunks are then a multiple of 16 rows); else as without.
Tensor linearCrossEntropy(const Tensor& x, const Tensor& weight, const Tensor& target,
                          int64_t ignoreIndex = -100, int64_t chunkRows = 0,
                          const autograd::Fp8LinearState* fp8 = nullptr);
// Identity when !training or p == 0. The mask comes from `gen` and is replayed, not stored, for the backward.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator& gen = defaultGenerator());

// ---- joining and splitting
// ----------------------------------------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// Views of consecutive pieces of `sizes` along dim.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// ---- attention
// ----------------------------------------------------------------------------------------------------
struct AttentionMask {
  bool causal = false;
  // [B, S_k]: non-zero marks a key position to ignore (padding). Undefined for none.
  Tensor keyPadding;
  // Added to the scores, broadcastable to [B, H, S_q, S_k] (relative position bias). Undefined for none.
  Tensor bias;
};
// q [B, H, S_q, D], k and v [B, H, S_k, D] -> [B, H, S_q, D]. softmax(q k^T * scale + mask) v, composed of
// ops. scale <= 0 means 1/sqrt(D).
Tensor scaledDotProductAttention(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const AttentionMask& mask = {}, double dropoutP = 0.0, bool training = true,
                                 double scale = 0.0, Generator& gen = defaultGenerator());

// Fused attention (ops::flashAttention): q [B, S_q, H, D], k and v [B, S_k, H, D] views -> [B, S_q, H, D],
// never materialising the scores. No key padding; causal masking as above. dropoutP > 0 drops probabilities
// with the mask scaledDotProductAttention draws from the same state of `gen` (NOTE [Fused attention dropout]
// in ops/Ops.h); pass 0 outside training. `bias`, where defined, is added to the scaled scores: [1 or B, H,
// S_q, S_k] in q's dtype (T5's relative positions; NOTE [Biased fused attention] in
// kernels/FlashAttention.cuh); its gradient is summed over the batch where it is shared.
Tensor flashAttention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale = 0.0,
                      double dropoutP = 0.0, Generator& gen = defaultGenerator(),
                      const Tensor& bias = Tensor());
// Self-attention straight from a packed projection: qkv [B, S, 3 * H * D] (q, k, v blocks, heads inside each)
// -> [B, S, H * D]. The backward writes dq, dk and dv into one packed gradient, with no copies in between.
Tensor flashAttentionPacked(const Tensor& qkv, int64_t heads, bool causal, double scale = 0.0,
                            double dropoutP = 0.0, Generator& gen = defaultGenerator(),
                            const Tensor& bias = Tensor());
// Whether the fused path can take `mask` for B batches of H heads, S_q queries and S_k keys in `dtype`: no
// key padding, and a bias that is undefined or [1 or B, H, S_q, S_k] in `dtype`. The causal flag is the
// caller's own.
bool fusedAttentionTakes(const AttentionMask& mask, int64_t B, int64_t H, int64_t Sq, int64_t Sk,
                         DType dtype);
// Whether the fused path serves these operands ([B, S, H, D] views) and options on their device: CUDA,
// bf16/f16, head dim 64, 80 or 128. STRATA_ATTENTION=composed turns it off. Dropout while training runs in
// Strata's kernel (never cuDNN's), which replays the composed path's mask (NOTE [Fused attention dropout]);
// STRATA_ATTENTION_DROPOUT=composed sends it to the composed path instead.
bool flashAttentionUsable(const Tensor& q, const Tensor& k, const Tensor& v, double dropoutP, bool training);
// Whether attention dropout may take the fused path: yes unless STRATA_ATTENTION_DROPOUT=composed (read
// once).
bool fusedAttentionDropout();

}  // namespace strata
