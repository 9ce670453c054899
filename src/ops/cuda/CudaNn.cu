// CUDA launchers and registration: embedding and cross-entropy.
#include <cstdlib>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "kernels/Nn.cuh"
#include "src/ops/cuda/CudaCommon.h"
#include "strata/ops/Ops.h"

namespace strata::ops::cuda {
namespace {

int threadsFor(int64_t C) {
  return int(std::clamp<int64_t>((C + 31) / 32 * 32, 32, 1024));
}

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DeviceGuard guard(weight.device().index);
  int64_t V = weight.size(0), C = weight.size(1), N = indices.numel();
  static const bool checkIndices = [] {
    const char* v = std::getenv("STRATA_CHECK_INDICES");
    return v && std::string(v) == "1";
  }();
  Tensor bad = checkIndices ? ops::zeros({1}, DType::I32, weight.device()) : Tensor();
  visitAllCuda(weight.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    visitIndexType(indices.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      kernels::embeddingKernel<T, I><<<unsigned(N), threadsFor(C), 0, streamOf(weight)>>>(
          static_cast<const T*>(weight.data()), static_cast<const I*>(indices.data()),
          static_cast<T*>(out.data()), C, V, checkIndices ? static_cast<int*>(bad.data()) : nullptr);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
  // Out-of-range ids leave their rows unwritten and raise `bad`. Reading the flag would synchronise the
  // device on every forward, so the check happens only under STRATA_CHECK_INDICES=1; the trainer validates
  // its data's token range before training instead.
  if (checkIndices) STRATA_CHECK(bad.item() == 0.0, "embedding: an index is out of range [0, {})", V);
}

void embeddingBackward(const Tensor& gy, const Tensor& indices, const Tensor& gw) {
  DeviceGuard guard(gy.device().index);
  int64_t V = gw.size(0), C = gw.size(1), N = indices.numel();
  if (N == 0) return;
  STRATA_CHECK(V < (int64_t(1) << 30) && N < (int64_t(1) << 31), "embedding_backward: {} rows of {} ids", N,
               V);
  Device device = gy.device();
  cudaStream_t stream = streamOf(gy);
  // Ids and positions, sorted by id (stable: each id's positions stay in input order). The sort looks at the
  // bits that ids up to V (out of range) use.
  Tensor keys = Tensor::empty({N}, DType::I32, device), sortedKeys = Tensor::empty({N}, DType::I32, device);
  Tensor positions = Tensor::empty({N}, DType::I32, device), sorted = Tensor::empty({N}, DType::I32, device);
  visitIndexType(indices.dtype(), [&](auto itag) {
    using I = typename decltype(itag)::type;
    kernels::embeddingKeysKernel<I><<<gridFor(N), 256, 0, stream>>>(static_cast<const I*>(indices.data()), N,
                                                                    V, static_cast<int*>(keys.data()),
                                                                    static_cast<int*>(positions.data()));
    STRATA_CUDA_CHECK_LAUNCH();
  });
  int endBit = 1;
  while ((int64_t(1) << endBit) <= V) ++endBit;
  size_t scratchBytes = 0;
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, scratchBytes, static_cast<int*>(keys.data()), static_cast<int*>(sortedKeys.data()),
      static_cast<int*>(positions.data()), static_cast<int*>(sorted.data()), int(N), 0, endBit, stream));
  Tensor scratch = Tensor::empty({int64_t(std::max<size_t>(scratchBytes, 1))}, DType::U8, device);
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      scratch.data(), scratchBytes, static_cast<int*>(keys.data()), static_cast<int*>(sortedKeys.data()),
      static_cast<int*>(positions.data()), static_cast<int*>(sorted.data()), int(N), 0, endBit, stream));
  visitFloatingCuda(gy.dtype(), "embedding_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::embeddingBackwardSortedKernel<T><<<unsigned(N), threadsFor(C), 0, stream>>>(
        static_cast<const T*>(gy.data()), static_cast<const int*>(sortedKeys.data()),
        static_cast<const int*>(sorted.data()), static_cast<float*>(gw.data()), N, C, V);
    STRATA_CUDA_CHECK_LAUNCH();
  });
}

void crossEntropy(const Tensor& logits, const Tensor& target, const Tensor& loss, const Tensor& lse,
                  const Tensor& valid, int64_t ignoreIndex) {
  DeviceGuard guard(logits.device().index);
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloatingCuda(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      kernels::crossEntropyKernel<T, I><<<unsigned(N), std::min(threadsFor(V), 512), 0, streamOf(logits)>>>(
          static_cast<const T*>(logits.data()), static_cast<const I*>(target.data()),
          static_cast<float*>(loss.data()), static_cast<float*>(lse.data()),
          static_cast<float*>(valid.data()), V, ignoreIndex);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void crossEntropyBackward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& scale,
                          const Tensor& glogits, int64_t ignoreIndex) {
  DeviceGuard guard(logits.device().index);
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloatingCuda(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      kernels::crossEntropyBackwardKernel<T, I>
          <<<unsigned(N), std::min(threadsFor(V), 512), 0, streamOf(logits)>>>(
              static_cast<const T*>(logits.data()), static_cast<const I*>(target.data()),
              static_cast<const float*>(lse.data()), static_cast<const float*>(scale.data()),
              static_cast<T*>(glogits.data()), V, ignoreIndex);
      STRATA_CUDA_CHECK_LAUNCH();
    });
  });
}

void crossEntropyInPlace(const Tensor& logits, const Tensor& target, const Tensor& loss, const Tensor& valid,
                         bool grad, int64_t ignoreIndex) {
  DeviceGuard guard(logits.device().index);
  int64_t N = logits.size(0), V = logits.size(1);
  visitFloatingCuda(logits.dtype(), "cross_entropy_in_place", [&](auto tag) {
    using T = typename decltype(tag)::type;
    visitIndexType(target.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      constexpr int P = kernels::kVec<T>;
      bool packed = V % P == 0 && reinterpret_cast<uintptr_t>(logits.data()) % 16 == 0;
      auto launch = [&](auto kernel, int64_t units) {
        kernel<<<unsigned(N), std::min(threadsFor(units), 512), 0, streamOf(logits)>>>(
            static_cast<T*>(logits.data()), static_cast<const I*>(target.data()),
            static_cast<float*>(loss.data()), static_cast<float*>(valid.data()), V, grad, ignoreIndex);
        STRATA_CUDA_CHECK_LAUNCH();
      };
      if (packed)
        launch(kernels::crossEntropyInPlaceKernel<T, I, P>, V / P);
      else
        launch(kernels::crossEntropyInPlaceKernel<T, I, 1>, V);
    });
  });
}

}  // namespace

void registerNn(Registry& r) {
  r.add<EmbeddingKernel>("embedding", DeviceType::CUDA, &embedding);
  r.add<EmbeddingBackwardKernel>("embedding_backward", DeviceType::CUDA, &embeddingBackward);
  r.add<CrossEntropyKernel>("cross_entropy", DeviceType::CUDA, &crossEntropy);
  r.add<CrossEntropyBackwardKernel>("cross_entropy_backward", DeviceType::CUDA, &crossEntropyBackward);
  r.add<CrossEntropyInPlaceKernel>("cross_entropy_in_place", DeviceType::CUDA, &crossEntropyInPlace);
}

}  // namespace strata::ops::cuda
