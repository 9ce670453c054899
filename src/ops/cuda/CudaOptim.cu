// CUDA launcher and registration: fused multi-tensor AdamW.
#include "kernels/Optim.cuh"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

void adamw(const std::vector<AdamWTensors>& sets, const AdamWHyper& h, const Tensor& gradScale) {
  if (sets.empty()) return;
  Device dev = sets[0].param.device();
  DeviceGuard guard(dev.index);
  std::vector<kernels::AdamChunk> chunks;
  for (const auto& s : sets) {
    int64_t n = s.param.numel();
    for (int64_t off = 0; off < n; off += kernels::kAdamChunk) {
      chunks.push_back(kernels::AdamChunk{
          static_cast<float*>(s.param.data()) + off, static_cast<const float*>(s.grad.data()) + off,
          static_cast<float*>(s.m.data()) + off, static_cast<float*>(s.v.data()) + off,
          std::min(kernels::kAdamChunk, n - off), s.weightDecay});
    }
  }
  if (chunks.empty()) return;
  STRATA_CHECK(chunks.size() < (size_t(1) << 31), "adamw: too many chunks ({})", chunks.size());
  // The descriptors travel in one small copy on the compute stream, ordered before the kernel that reads
  // them.
  size_t bytes = chunks.size() * sizeof(kernels::AdamChunk);
  Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
  cudaStream_t stream = streamOf(table);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream));
  kernels::AdamParams p{h.lr, h.beta1, h.beta2, h.eps, 1.0f / h.biasCorrection1, 1.0f / h.biasCorrection2};
  const float* scale = gradScale.defined() ? static_cast<const float*>(gradScale.data()) : nullptr;
  kernels::adamwKernel<<<unsigned(chunks.size()), 256, 0, stream>>>(
      static_cast<const kernels::AdamChunk*>(table.data()), p, scale);
  STRATA_CUDA_CHECK_LAUNCH();
  // `chunks` is pageable host memory: the copy above has completed its host-side read when cudaMemcpyAsync
  // returns.
}

}  // namespace

void registerOptim(Registry& r) {
  r.add<AdamWKernel>("adamw", DeviceType::CUDA, &adamw);
}

}  // namespace strata::ops::cuda
