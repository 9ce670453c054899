// CUDA launchers and registration: softmax and LayerNorm/RMSNorm.
#include "kernels/Normalization.cuh"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

// Calls fn.template operator()<V>() with the widest pack that divides C and keeps every pointer aligned to
// its pack: 16 bytes for `ptrs` (of T), V * wideBytes for `wide` (parameters stored wider than T).
template <class T, class Fn>
void withPack(int64_t C, std::initializer_list<const void*> ptrs, Fn&& fn,
              std::initializer_list<const void*> wide = {}, size_t wideBytes = sizeof(T)) {
  constexpr int V = kernels::kVec<T>;
  bool ok = C % V == 0;
  for (const void* p : ptrs) ok = ok && (p == nullptr || aligned16(p));
  for (const void* p : wide)
    ok = ok && (p == nullptr || reinterpret_cast<uintptr_t>(p) % (V * wideBytes) == 0);
  if (ok)
    fn.template operator()<V>();
  else
    fn.template operator()<1>();
}

int roundThreads(int64_t n) {
  return int(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 512));
}

// Picks how many packs each thread keeps in registers (P), aiming at <= `maxThreads` threads a row, and calls
// fn.template operator()<P>(threads). The kernels are bounded to 512 threads (128 registers each); rows wider
// than 8 * 512 packs stream (P = 0) when `allowStream`.
template <class Fn>
void withRowPlan(int64_t packs, bool allowStream, const char* op, Fn&& fn, int64_t maxThreads = 256) {
  if (packs <= maxThreads)
    fn.template operator()<1>(roundThreads(packs));
  else if (packs <= 2 * maxThreads)
    fn.template operator()<2>(roundThreads((packs + 1) / 2));
  else if (packs <= 4 * maxThreads)
    fn.template operator()<4>(roundThreads((packs + 3) / 4));
  else if (packs <= 8 * 512)
    fn.template operator()<8>(roundThreads((packs + 7) / 8));
  else if (allowStream)
    fn.template operator()<0>(512);
  else
    STRATA_FAIL("{}: rows of {} packs are wider than the kernel supports (4096)", op, packs);
}

void softmax(const Tensor& x, const Tensor& y, bool log, const SoftmaxOptions& o) {
  DeviceGuard guard(x.device().index);
  int64_t C = x.size(-1), N = x.numel() / C;
  visitFloatingCuda(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x.data());
    T* yp = static_cast<T*>(y.data());
    withPack<T>(C, {xp, yp}, [&]<int V>() {
      withRowPlan(C / V, true, "softmax", [&]<int P>(int threads) {
        kernels::softmaxKernel<T, V, P><<<unsigned(N), threads, 0, streamOf(x)>>>(
            xp, yp, C, log, float(o.scale), o.causalRows, o.causalShift);
      });
    });
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void softmaxBackward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log, double scale) {
  DeviceGuard guard(y.device().index);
  int64_t C = y.size(-1), N = y.numel() / C;
  visitFloatingCuda(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* yp = static_cast<const T*>(y.data());
    const T* gp = static_cast<const T*>(gy.data());
    T* op = static_cast<T*>(gx.data());
    withPack<T>(C, {yp, gp, op}, [&]<int V>() {
      withRowPlan(C / V, true, "softmax_backward", [&]<int P>(int threads) {
        kernels::softmaxBackwardKernel<T, V, P>
            <<<unsigned(N), threads, 0, streamOf(y)>>>(yp, gp, op, C, log, float(scale));
      });
    });
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
const T* ptrOrNull(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data()) : nullptr;
}

// Calls fn(TypeTag<W>) with the parameters' storage type: T, or float for fp32 parameters of 16-bit rows.
template <class T, class Fn>
void withParamType(const Tensor& weight, const Tensor& bias, Fn&& fn) {
  const Tensor& p = weight.defined() ? weight : bias;
  if constexpr (!std::is_same_v<T, float>) {
    if (p.defined() && p.dtype() == DType::F32) {
      fn(TypeTag<float>{});
      return;
    }
  }
  fn(TypeTag<T>{});
}

void norm(const Tensor& x, const Tensor& residual, const Tensor& sum, const Tensor& weight,
          const Tensor& bias, const Tensor& y, const Tensor& mean, const Tensor& rstd, double eps, bool rms) {
  DeviceGuard guard(x.device().index);
  int64_t C = x.size(-1), N = x.numel() / C;
  visitFloatingCuda(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    withParamType<T>(weight, bias, [&](auto ptag) {
      using W = typename decltype(ptag)::type;
      const T* xp = static_cast<const T*>(x.data());
      const T* rsp = ptrOrNull<T>(residual);
      T* sp = sum.defined() ? static_cast<T*>(sum.data()) : nullptr;
      const W* wp = ptrOrNull<W>(weight);
      const W* bp = ptrOrNull<W>(bias);
      T* yp = static_cast<T*>(y.data());
      float* mp = mean.defined() ? static_cast<float*>(mean.data()) : nullptr;
      float* rp = static_cast<float*>(rstd.data());
      withPack<T>(
          C, {xp, rsp, sp, yp},
          [&]<int V>() {
            withRowPlan(C / V, true, "layer_norm", [&]<int P>(int threads) {
              kernels::normKernel<T, W, V, P><<<unsigned(N), threads, 0, streamOf(x)>>>(
                  xp, rsp, sp, wp, bp, yp, mp, rp, C, float(eps), rms);
            });
          },
          {wp, bp}, sizeof(W));
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void normBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                  const Tensor& rstd, const Tensor& gextra, const Tensor& gx, const Tensor& gw,
                  const Tensor& gb, bool rms) {
  int device = x.device().index;
  DeviceGuard guard(device);
  int64_t C = x.size(-1), N = x.numel() / C;
  cudaStream_t stream = streamOf(x);
  visitFloatingCuda(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    withParamType<T>(weight, Tensor(), [&](auto ptag) {
      using W = typename decltype(ptag)::type;
      const T* gp = static_cast<const T*>(gy.data());
      const T* xp = static_cast<const T*>(x.data());
      const W* wp = ptrOrNull<W>(weight);
      const T* ep = ptrOrNull<T>(gextra);
      const float* mp = mean.defined() ? static_cast<const float*>(mean.data()) : nullptr;
      const float* rp = static_cast<const float*>(rstd.data());
      T* op = static_cast<T*>(gx.data());
      bool params = gw.defined() || gb.defined();
      withPack<T>(
          C, {gp, xp, ep, op},
          [&]<int V>() {
            // Up to 512 threads a row: the parameter partials live in registers, so fewer packs per thread
            // means more resident threads.
            withRowPlan(
                C / V, false, "layer_norm_backward",
                [&]<int P>(int threads) {
                  if constexpr (P > 0) {
                    auto kernel = params ? kernels::normBackwardKernel<T, W, V, P, true>
                                         : kernels::normBackwardKernel<T, W, V, P, false>;
                    // With parameter gradients, exactly one wave of blocks strides over the rows; each block
                    // writes one row of fp32 partials.
                    int perSm = 0;
                    STRATA_CUDA_CHECK(
                        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, threads, 0));
                    int64_t blocks =
                        params ? std::min<int64_t>(N, std::max(perSm, 1) * int64_t(smCount(device))) : N;
                    Tensor partW =
                        gw.defined() ? Tensor::empty({blocks, C}, DType::F32, x.device()) : Tensor();
                    Tensor partB =
                        gb.defined() ? Tensor::empty({blocks, C}, DType::F32, x.device()) : Tensor();
                    float* pw = partW.defined() ? static_cast<float*>(partW.data()) : nullptr;
                    float* pb = partB.defined() ? static_cast<float*>(partB.data()) : nullptr;
                    kernel<<<unsigned(blocks), threads, 0, stream>>>(gp, xp, wp, mp, rp, ep, op, pw, pb, N, C,
                                                                     rms);
                    STRATA_CUDA_CHECK_LAUNCH();
                    if (pw)
                      launchReduce(0, pw, DType::F32, gw.data(), DType::F32, 1, blocks, C, device, stream);
                    if (pb)
                      launchReduce(0, pb, DType::F32, gb.data(), DType::F32, 1, blocks, C, device, stream);
                  }
                },
                512);
          },
          {wp}, sizeof(W));
    });
  });
}

}  // namespace

void registerNormalization(Registry& r) {
  r.add<SoftmaxKernel>("softmax", DeviceType::CUDA, &softmax);
  r.add<SoftmaxBackwardKernel>("softmax_backward", DeviceType::CUDA, &softmaxBackward);
  r.add<NormKernel>("norm", DeviceType::CUDA, &norm);
  r.add<NormBackwardKernel>("norm_backward", DeviceType::CUDA, &normBackward);
}

}  // namespace strata::ops::cuda
