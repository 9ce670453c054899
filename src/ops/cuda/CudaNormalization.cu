// CUDA launchers and registration: softmax and LayerNorm/RMSNorm.
#include "kernels/Normalization.cuh"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

int rowThreads(int64_t packs) { return int(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, 512)); }

// Calls fn.template operator()<V>() with the widest pack that divides C and keeps every pointer 16-byte aligned.
template <class T, class Fn>
void withPack(int64_t C, std::initializer_list<const void*> ptrs, Fn&& fn) {
  constexpr int V = kernels::kVec<T>;
  bool ok = C % V == 0;
  for (const void* p : ptrs) ok = ok && (p == nullptr || aligned16(p));
  if (ok) fn.template operator()<V>();
  else fn.template operator()<1>();
}

void softmax(const Tensor& x, const Tensor& y, bool log) {
  DeviceGuard guard(x.device().index);
  int64_t C = x.size(-1), N = x.numel() / C;
  visitFloatingCuda(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x.data());
    T* yp = static_cast<T*>(y.data());
    withPack<T>(C, {xp, yp}, [&]<int V>() {
      kernels::softmaxKernel<T, V><<<unsigned(N), rowThreads(C / V), 0, streamOf(x)>>>(xp, yp, C, log);
    });
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void softmaxBackward(const Tensor& y, const Tensor& gy, const Tensor& gx, bool log) {
  DeviceGuard guard(y.device().index);
  int64_t C = y.size(-1), N = y.numel() / C;
  visitFloatingCuda(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* yp = static_cast<const T*>(y.data());
    const T* gp = static_cast<const T*>(gy.data());
    T* op = static_cast<T*>(gx.data());
    withPack<T>(C, {yp, gp, op}, [&]<int V>() {
      kernels::softmaxBackwardKernel<T, V><<<unsigned(N), rowThreads(C / V), 0, streamOf(y)>>>(yp, gp, op, C, log);
    });
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
const T* ptrOrNull(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data()) : nullptr;
}

void norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& y, const Tensor& mean,
          const Tensor& rstd, double eps, bool rms) {
  DeviceGuard guard(x.device().index);
  int64_t C = x.size(-1), N = x.numel() / C;
  visitFloatingCuda(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xp = static_cast<const T*>(x.data());
    const T* wp = ptrOrNull<T>(weight);
    const T* bp = ptrOrNull<T>(bias);
    T* yp = static_cast<T*>(y.data());
    float* mp = mean.defined() ? static_cast<float*>(mean.data()) : nullptr;
    float* rp = static_cast<float*>(rstd.data());
    withPack<T>(C, {xp, wp, bp, yp}, [&]<int V>() {
      kernels::normKernel<T, V><<<unsigned(N), rowThreads(C / V), 0, streamOf(x)>>>(xp, wp, bp, yp, mp, rp, C,
                                                                                       float(eps), rms);
    });
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void normBackward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                  const Tensor& gx, const Tensor& gw, const Tensor& gb, bool rms) {
  int device = x.device().index;
  DeviceGuard guard(device);
  int64_t C = x.size(-1), N = x.numel() / C;
  cudaStream_t stream = streamOf(x);
  visitFloatingCuda(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = static_cast<const T*>(gy.data());
    const T* xp = static_cast<const T*>(x.data());
    const T* wp = ptrOrNull<T>(weight);
    const float* mp = mean.defined() ? static_cast<const float*>(mean.data()) : nullptr;
    const float* rp = static_cast<const float*>(rstd.data());
    T* op = static_cast<T*>(gx.data());
    bool params = gw.defined() || gb.defined();
    // Enough blocks to fill the GPU; each strides over rows. The fp32 partials of the parameter gradients live in
    // shared memory (2 * C floats), so very wide rows fall back to fewer, row-per-block launches without them.
    size_t smem = params ? size_t(2 * C) * sizeof(float) : 0;
    STRATA_CHECK(smem <= 200 * 1024, "layer_norm backward: hidden size {} too large for the fused kernel", C);
    int64_t blocks = params ? std::min<int64_t>(N, 2 * smCount(device)) : N;
    Tensor partW = gw.defined() ? Tensor::empty({blocks, C}, DType::F32, x.device()) : Tensor();
    Tensor partB = gb.defined() ? Tensor::empty({blocks, C}, DType::F32, x.device()) : Tensor();
    float* pw = partW.defined() ? static_cast<float*>(partW.data()) : nullptr;
    float* pb = partB.defined() ? static_cast<float*>(partB.data()) : nullptr;
    withPack<T>(C, {gp, xp, wp, op}, [&]<int V>() {
      int threads = rowThreads(C / V);
      if (params) {
        auto kernel = kernels::normBackwardKernel<T, V, true>;
        if (smem > 48 * 1024)
          STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        kernel<<<unsigned(blocks), threads, smem, stream>>>(gp, xp, wp, mp, rp, op, pw, pb, N, C, rms);
      } else {
        kernels::normBackwardKernel<T, V, false>
            <<<unsigned(blocks), threads, 0, stream>>>(gp, xp, wp, mp, rp, op, nullptr, nullptr, N, C, rms);
      }
    });
    STRATA_CUDA_CHECK_LAUNCH();
    if (pw) launchReduce(0, pw, DType::F32, gw.data(), DType::F32, 1, blocks, C, device, stream);
    if (pb) launchReduce(0, pb, DType::F32, gb.data(), DType::F32, 1, blocks, C, device, stream);
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
