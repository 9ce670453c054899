// CUDA launchers and registration: fused (flash) attention forward and backward.
#include "kernels/FlashAttention.cuh"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

namespace fl = kernels::flash;
// Forward: 8 warps share each K/V tile (128 queries a CTA); backward: 4 warps (64 keys or queries a CTA), as
// the dK/dV kernel's accumulators take the whole register budget.
constexpr int kForwardWarps = 8;
constexpr int kWarps = 4;

fl::Operand operand(const Tensor& t) {
  return fl::Operand{t.data(), t.strides()[0], t.strides()[1], t.strides()[2]};
}

fl::Params params(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse2,
                  const AttentionOptions& opt) {
  fl::Params p;
  p.q = operand(q);
  p.k = operand(k);
  p.v = operand(v);
  p.o = operand(o);
  p.lse2 = static_cast<float*>(lse2.data());
  p.B = int(q.size(0));
  p.Sq = int(q.size(1));
  p.H = int(q.size(2));
  p.Sk = int(k.size(1));
  p.scale = float(opt.scale);
  p.scaleLog2 = float(opt.scale * 1.4426950408889634);
  p.causal = opt.causal;
  p.shift = p.Sk - p.Sq;
  p.dropThreshold = dropThreshold(opt.dropout);
  p.dropGroups = opt.offset % 8 == 0 && p.Sk % 8 == 0;
  p.dropScale = opt.dropout > 0 ? float(1.0 / (1.0 - opt.dropout)) : 1.0f;
  p.seed = opt.seed;
  p.offset = opt.offset;
  if (opt.bias.defined()) {  // NOTE [Biased fused attention]
    const Tensor& bias = opt.bias;
    p.bias = bias.data();
    p.biasB = bias.size(0) == 1 ? 0 : bias.strides()[0];
    p.biasH = bias.strides()[1];
    p.biasS = bias.strides()[2];
  }
  return p;
}

// Calls fn.template operator()<DROP, BIAS>() (NOTE [Fused attention dropout], NOTE [Biased fused attention]).
template <class Fn>
void visitDropBias(const AttentionOptions& opt, Fn&& fn) {
  auto withDrop = [&]<bool BIAS>() {
    if (opt.dropout > 0)
      fn.template operator()<true, BIAS>();
    else
      fn.template operator()<false, BIAS>();
  };
  if (opt.bias.defined())
    withDrop.template operator()<true>();
  else
    withDrop.template operator()<false>();
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int warps, int smemBytes, cudaStream_t stream, const fl::Params& p) {
  // Opting in to more than 48 KiB of shared memory is a per-kernel attribute; setting it every call is cheap.
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes));
  kernel<<<grid, warps * 32, smemBytes, stream>>>(p);
  STRATA_CUDA_CHECK_LAUNCH();
}

// Calls fn.template operator()<T, D>() for the supported dtypes and head dims.
template <class Fn>
void visitFlash(DType dtype, int64_t D, Fn&& fn) {
  auto withDim = [&]<class T>() {
    if (D == 64)
      fn.template operator()<T, 64>();
    else if (D == 80)
      fn.template operator()<T, 80>();  // GPT-3 2.7B
    else if (D == 128)
      fn.template operator()<T, 128>();
    else
      STRATA_FAIL("flash attention: head dim {} is not supported (64, 80 or 128)", D);
  };
  if (dtype == DType::BF16)
    withDim.template operator()<__nv_bfloat16>();
  else if (dtype == DType::F16)
    withDim.template operator()<__half>();
  else
    STRATA_FAIL("flash attention on cuda needs bf16 or f16, got {}", dtype);
}

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse2,
             const AttentionOptions& opt) {
  DeviceGuard guard(q.device().index);
  fl::Params p = params(q, k, v, out, lse2, opt);
  p.out = out.data();
  constexpr int BM = 16 * kForwardWarps;
  dim3 grid(unsigned((p.Sq + BM - 1) / BM), unsigned(p.B * p.H));
  visitFlash(q.dtype(), q.size(3), [&]<class T, int D>() {
    int smem = (BM + 4 * fl::kBlockN) * fl::kSmemStride<D> * 2;
    visitDropBias(opt, [&]<bool DROP, bool BIAS>() {
      launch(fl::forwardKernel<T, D, kForwardWarps, DROP, BIAS>, grid, kForwardWarps, smem, streamOf(q), p);
    });
  });
}

void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
              const Tensor& lse2, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dbias,
              const AttentionOptions& opt) {
  DeviceGuard guard(q.device().index);
  fl::Params p = params(q, k, v, out, lse2, opt);
  p.dout = operand(dout);
  p.dq = dq.data();
  p.dk = dk.data();
  p.dv = dv.data();
  p.dqS = operand(dq);
  p.dkS = operand(dk);
  p.dvS = operand(dv);
  if (dbias.defined()) {
    p.dbias = static_cast<float*>(dbias.data());
    p.dbiasB = dbias.size(0) == 1 ? 0 : int64_t(p.H) * p.Sq * p.Sk;
  }
  Tensor delta = Tensor::empty({q.size(0), q.size(2), q.size(1)}, DType::F32, q.device());
  p.delta = static_cast<float*>(delta.data());
  cudaStream_t stream = streamOf(q);
  constexpr int B16 = 16 * kWarps;
  visitFlash(q.dtype(), q.size(3), [&]<class T, int D>() {
    int64_t rows = int64_t(p.B) * p.H * p.Sq;
    fl::deltaKernel<T, D><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(p);
    STRATA_CUDA_CHECK_LAUNCH();
    int smemKv = (2 * B16 + 4 * fl::kBlockN) * fl::kSmemStride<D> * 2 + 4 * fl::kBlockN * int(sizeof(float));
    int smemQ = (2 * B16 + 4 * fl::kBlockN) * fl::kSmemStride<D> * 2;
    visitDropBias(opt, [&]<bool DROP, bool BIAS>() {
      launch(fl::backwardKvKernel<T, D, kWarps, DROP, BIAS>,
             dim3(unsigned((p.Sk + B16 - 1) / B16), unsigned(p.B * p.H)), kWarps, smemKv, stream, p);
      launch(fl::backwardQKernel<T, D, kWarps, DROP, BIAS>,
             dim3(unsigned((p.Sq + B16 - 1) / B16), unsigned(p.B * p.H)), kWarps, smemQ, stream, p);
    });
  });
}

}  // namespace

void registerAttention(Registry& r) {
  r.add<FlashAttentionKernel>("flash_attention", DeviceType::CUDA, &forward);
  r.add<FlashAttentionBackwardKernel>("flash_attention_backward", DeviceType::CUDA, &backward);
}

}  // namespace strata::ops::cuda
