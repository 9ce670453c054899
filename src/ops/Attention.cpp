// Fused attention front end: validation, layout requirements, allocation.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "Kernels.h"
#include "strata/ops/Ops.h"

namespace strata::ops {
namespace {

void checkOperand(const Tensor& t, const char* name) {
  STRATA_CHECK(t.dim() == 4, "flash attention: {} must be [B, S, H, D], got {}", name, toString(t.shape()));
  STRATA_CHECK(t.strides()[3] == 1, "flash attention: {} needs a contiguous last dim", name);
}

// The CUDA kernels load 16-byte chunks: every stride and the base must be 16-byte aligned.
bool chunkAligned(const Tensor& t) {
  int64_t es = int64_t(dtypeSize(t.dtype()));
  if ((reinterpret_cast<uintptr_t>(t.data()) & 15u) != 0) return false;
  for (int d = 0; d < 3; ++d)
    if ((t.strides()[size_t(d)] * es) % 16 != 0) return false;
  return t.strides()[3] == 1;
}

Tensor aligned(const Tensor& t) {
  return t.device().isCpu() || chunkAligned(t) ? t : contiguous(t);
}

// cuDNN's fused attention, in a build that has it, unless asked for Strata's kernel (AttentionBackend, or
// STRATA_ATTENTION=native for Auto): it is the faster one on the H200 (BENCHMARKS.md).
bool cudnnChosen(Device device, AttentionBackend backend) {
  static const bool byDefault = [] {
    const char* e = std::getenv("STRATA_ATTENTION");
    return e == nullptr || std::strcmp(e, "native") != 0;
  }();
  bool wanted = backend == AttentionBackend::Cudnn || (backend == AttentionBackend::Auto && byDefault);
  return wanted && device.isCuda() && cudnnAttentionBuilt();
}

}  // namespace

bool cudnnAttentionBuilt() {
  return Registry::instance().has("cudnn_attention", DeviceType::CUDA);
}

namespace {

double resolveScale(const AttentionOptions& o, int64_t D) {
  return o.scale > 0 ? o.scale : 1.0 / std::sqrt(double(D));
}

}  // namespace

bool flashAttentionSupported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.device() != k.device() || q.device() != v.device()) return false;
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) return false;
  if (q.size(3) != k.size(3) || q.size(3) != v.size(3)) return false;
  if (q.device().isCpu())
    return q.dtype() == DType::F32 || q.dtype() == DType::F64 || q.dtype() == DType::BF16 ||
           q.dtype() == DType::F16;
  int64_t D = q.size(3);
  return (q.dtype() == DType::BF16 || q.dtype() == DType::F16) && (D == 64 || D == 80 || D == 128) &&
         q.size(1) < (int64_t(1) << 30);
}

bool flashAttentionBiasFits(const Tensor& bias, const Tensor& q, const Tensor& k) {
  if (bias.dim() != 4 || q.dim() != 4 || k.dim() != 4) return false;
  int64_t B = q.size(0), Sq = q.size(1), H = q.size(2), Sk = k.size(1);
  return (bias.size(0) == 1 || bias.size(0) == B) && bias.size(1) == H && bias.size(2) == Sq &&
         bias.size(3) == Sk && bias.dtype() == q.dtype() && bias.device() == q.device();
}

namespace {

// The bias as the kernels read it (NOTE [Biased fused attention]): a contiguous last dim.
Tensor biasOperand(const Tensor& bias, const Tensor& q, const Tensor& k) {
  if (!bias.defined()) return bias;
  STRATA_CHECK(flashAttentionBiasFits(bias, q, k),
               "flash attention: the bias must be [1 or {}, {}, {}, {}] in {} on {}, got {} {} on {}",
               q.size(0), q.size(2), q.size(1), k.size(1), q.dtype(), toString(q.device()),
               toString(bias.shape()), bias.dtype(), toString(bias.device()));
  return bias.strides()[3] == 1 ? bias : contiguous(bias);
}

}  // namespace

FlashAttentionResult flashAttention(const Tensor& qIn, const Tensor& kIn, const Tensor& vIn,
                                    const AttentionOptions& options) {
  checkOperand(qIn, "q");
  checkOperand(kIn, "k");
  checkOperand(vIn, "v");
  STRATA_CHECK(
      flashAttentionSupported(qIn, kIn, vIn),
      "flash attention: unsupported operands q {} {}, k {}, v {} on {} (CUDA: bf16/f16, head dim 64, "
      "80 or 128)",
      toString(qIn.shape()), qIn.dtype(), toString(kIn.shape()), toString(vIn.shape()),
      toString(qIn.device()));
  int64_t B = qIn.size(0), Sq = qIn.size(1), H = qIn.size(2), D = qIn.size(3), Sk = kIn.size(1);
  STRATA_CHECK(kIn.shape() == Shape({B, Sk, H, D}) && vIn.shape() == kIn.shape(),
               "flash attention: k and v must be [{}, S_k, {}, {}], got {} and {}", B, H, D,
               toString(kIn.shape()), toString(vIn.shape()));
  STRATA_CHECK(!options.causal || Sk >= Sq, "flash attention: causal masking needs S_k >= S_q, got {} and {}",
               Sk, Sq);
  STRATA_CHECK(options.dropout >= 0.0 && options.dropout < 1.0,
               "flash attention: dropout must be in [0, 1), got {}", options.dropout);
  Tensor q = aligned(qIn), k = aligned(kIn), v = aligned(vIn);
  AttentionOptions o = options;
  o.scale = resolveScale(options, D);
  o.bias = biasOperand(options.bias, q, k);
  FlashAttentionResult r;
  r.out = Tensor::empty({B, Sq, H, D}, q.dtype(), q.device());
  r.lse2 = Tensor::empty({B, H, Sq}, statsDType(q.dtype()), q.device());
  r.dropout = o.dropout;
  r.seed = o.seed;
  r.offset = o.offset;
  // NOTE [Fused attention dropout]: cuDNN draws its own mask.
  if (o.dropout == 0.0 && cudnnChosen(q.device(), options.backend) &&
      kernel<CudnnAttentionKernel>("cudnn_attention", q.device())(q, k, v, r.out, r.lse2, o)) {
    // cuDNN's statistics are natural-log: lse2 is log2-domain whichever backend wrote it.
    copy(r.lse2, affine(r.lse2, 1.0 / std::log(2.0), 0.0));
    r.cudnn = true;
    return r;
  }
  kernel<FlashAttentionKernel>("flash_attention", q.device())(q, k, v, r.out, r.lse2, o);
  return r;
}

void flashAttentionBackward(const Tensor& qIn, const Tensor& kIn, const Tensor& vIn,
                            const FlashAttentionResult& saved, const Tensor& doutIn, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const AttentionOptions& options,
                            const Tensor& dbias) {
  STRATA_CHECK(doutIn.shape() == saved.out.shape(),
               "flash attention backward: gradient of shape {} for output {}", toString(doutIn.shape()),
               toString(saved.out.shape()));
  STRATA_CHECK(dq.shape() == qIn.shape() && dk.shape() == kIn.shape() && dv.shape() == vIn.shape(),
               "flash attention backward: gradient buffers must match q, k, v");
  for (const Tensor* g : {&dq, &dk, &dv}) {
    checkOperand(*g, "a gradient");
    STRATA_CHECK(g->dtype() == qIn.dtype() && g->device() == qIn.device(),
                 "flash attention backward: gradient buffers must be {} on {}", qIn.dtype(),
                 toString(qIn.device()));
    STRATA_CHECK(g->device().isCpu() || chunkAligned(*g),
                 "flash attention backward: gradient buffers need 16-byte aligned strides");
  }
  Tensor q = aligned(qIn), k = aligned(kIn), v = aligned(vIn), dout = aligned(doutIn);
  AttentionOptions o = options;
  o.scale = resolveScale(options, qIn.size(3));
  o.bias = biasOperand(options.bias, q, k);
  STRATA_CHECK(!dbias.defined() || (o.bias.defined() && dbias.shape() == o.bias.shape()),
               "flash attention backward: a bias gradient of shape {} for the bias {}",
               toString(dbias.shape()), o.bias.defined() ? toString(o.bias.shape()) : std::string("(none)"));
  // NOTE [Biased fused attention]: the kernels add each batch's share into a zeroed fp32 accumulator.
  Tensor dbiasSum = dbias.defined() ? zeros(o.bias.shape(), statsDType(q.dtype()), q.device()) : Tensor();
  STRATA_CHECK(
      o.dropout == saved.dropout && (o.dropout == 0.0 || (o.seed == saved.seed && o.offset == saved.offset)),
      "flash attention backward: dropout {} (seed {}, offset {}) differs from the forward's {} ({}, {})",
      o.dropout, o.seed, o.offset, saved.dropout, saved.seed, saved.offset);
  auto finish = [&] {
    if (dbias.defined()) copy(dbias, dbiasSum);
  };
  if (saved.cudnn) {  // never with dropout: the forward does not ask cuDNN then
    Tensor natural = affine(saved.lse2, std::log(2.0), 0.0);
    if (kernel<CudnnAttentionBackwardKernel>("cudnn_attention_backward", q.device())(
            q, k, v, saved.out, dout, natural, dq, dk, dv, dbiasSum, o)) {
      finish();
      return;
    }
    // cuDNN ran the forward but refuses this backward (a bias gradient it cannot make, say): Strata's kernel
    // recomputes the forward for its own statistics (its output matches cuDNN's to rounding) and runs the
    // backward.
    FlashAttentionResult own = saved;
    own.out = Tensor::empty(saved.out.shape(), q.dtype(), q.device());
    own.lse2 = Tensor::empty(saved.lse2.shape(), saved.lse2.dtype(), q.device());
    kernel<FlashAttentionKernel>("flash_attention", q.device())(q, k, v, own.out, own.lse2, o);
    kernel<FlashAttentionBackwardKernel>("flash_attention_backward", q.device())(
        q, k, v, own.out, dout, own.lse2, dq, dk, dv, dbiasSum, o);
    finish();
    return;
  }
  kernel<FlashAttentionBackwardKernel>("flash_attention_backward", q.device())(
      q, k, v, saved.out, dout, saved.lse2, dq, dk, dv, dbiasSum, o);
  finish();
}

}  // namespace strata::ops
