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
      int kind = !s.copy.defined()               ? 0
                 : s.copy.dtype() == DType::BF16 ? 1
                 : s.copy.dtype() == DType::F16  ? 2
                                                 : 3;
      void* copy = kind == 0   ? nullptr
                   : kind == 3 ? static_cast<void*>(static_cast<float*>(s.copy.data()) + off)
                               : static_cast<void*>(static_cast<uint16_t*>(s.copy.data()) + off);
      chunks.push_back(kernels::AdamChunk{
          static_cast<float*>(s.param.data()) + off, static_cast<const float*>(s.grad.data()) + off,
          static_cast<float*>(s.m.data()) + off, static_cast<float*>(s.v.data()) + off,
          std::min(kernels::kAdamChunk, n - off), adamwDecayFactor(h.lr, s.weightDecay), copy, kind});
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
  kernels::AdamParams p{-h.lr,          h.beta1, 1.0f - h.beta1,           h.beta2,
                        1.0f - h.beta2, h.eps,   1.0f / h.biasCorrection1, 1.0f / h.biasCorrection2};
  const float* scale = gradScale.defined() ? static_cast<const float*>(gradScale.data()) : nullptr;
  kernels::adamwKernel<<<unsigned(chunks.size()), 256, 0, stream>>>(
      static_cast<const kernels::AdamChunk*>(table.data()), p, scale);
  STRATA_CUDA_CHECK_LAUNCH();
  // `chunks` is pageable host memory: the copy above has completed its host-side read when cudaMemcpyAsync
  // returns.
}

void sumOfSquares(const std::vector<Tensor>& tensors, const Tensor& out) {
  Device dev = out.device();
  DeviceGuard guard(dev.index);
  std::vector<kernels::NormChunk> chunks;
  for (const auto& t : tensors) {
    const float* base = static_cast<const float*>(t.data());
    for (int64_t off = 0; off < t.numel(); off += kernels::kAdamChunk)
      chunks.push_back(kernels::NormChunk{base + off, std::min(kernels::kAdamChunk, t.numel() - off)});
  }
  cudaStream_t stream = streamOf(out);
  if (chunks.empty()) {
    STRATA_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, sizeof(float), stream));
    return;
  }
  STRATA_CHECK(chunks.size() < (size_t(1) << 31), "sumOfSquares: too many chunks ({})", chunks.size());
  size_t bytes = chunks.size() * sizeof(kernels::NormChunk);
  Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
  Tensor partial = Tensor::empty({int64_t(chunks.size())}, DType::F32, dev);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), chunks.data(), bytes, cudaMemcpyHostToDevice, stream));
  kernels::sumSquaresKernel<<<unsigned(chunks.size()), 512, 0, stream>>>(
      static_cast<const kernels::NormChunk*>(table.data()), static_cast<float*>(partial.data()));
  STRATA_CUDA_CHECK_LAUNCH();
  kernels::sumPartialsKernel<<<1, 1024, 0, stream>>>(static_cast<const float*>(partial.data()),
                                                     int(chunks.size()), static_cast<float*>(out.data()));
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void registerOptim(Registry& r) {
  r.add<SumOfSquaresKernel>("sum_of_squares", DeviceType::CUDA, &sumOfSquares);
  r.add<AdamWKernel>("adamw", DeviceType::CUDA, &adamw);
}

}  // namespace strata::ops::cuda
