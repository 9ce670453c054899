// Host-side helpers of the CUDA backend: launch geometry, dtype visitation with device types, stream lookup.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/CudaContext.h"
#include "kernels/Common.cuh"
#include "src/ops/Kernels.h"

namespace strata::ops::cuda {

using strata::cuda::DeviceGuard;

inline cudaStream_t streamOf(const Tensor& t) {
  return strata::cuda::nativeStream(currentStream(t.device()));
}

// Grid for a grid-stride loop over `work` items with `threads` per block.
inline unsigned gridFor(int64_t work, int threads = 256) {
  int64_t blocks = (work + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(1) << 20));
}

inline int smCount(int device) {
  static int count[64] = {};
  if (count[device] == 0) {
    int v = 0;
    STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    count[device] = v;
  }
  return count[device];
}

// Calls fn(TypeTag<DeviceType>{}) for floating dtypes supported on the GPU (f32, bf16, f16).
template <class Fn>
void visitFloatingCuda(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::F32:
      fn(TypeTag<float>{});
      return;
    case DType::BF16:
      fn(TypeTag<__nv_bfloat16>{});
      return;
    case DType::F16:
      fn(TypeTag<__half>{});
      return;
    default:
      STRATA_FAIL("{}: dtype {} is not supported on cuda (f32, bf16, f16)", op, t);
  }
}

// Every dtype, as device types (f64 included for copies and fills).
template <class Fn>
void visitAllCuda(DType t, Fn&& fn) {
  visitDType(t, [&](auto tag) {
    using H = typename decltype(tag)::type;
    fn(TypeTag<kernels::DevT<H>>{});
  });
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

void registerCreation(Registry& r);
void registerElementwise(Registry& r);
void registerReduce(Registry& r);
void registerGemm(Registry& r);
void registerNormalization(Registry& r);
void registerNn(Registry& r);
void registerOptim(Registry& r);
void registerAttention(Registry& r);
void registerFp8(Registry& r);

// Reduces a contiguous fp32 or T [A, R, B] problem; used by the reduce ops and by other kernels' second
// passes. op: 0 sum, 1 max. out dtype is in's or f32.
void launchReduce(int op, const void* in, DType inType, void* out, DType outType, int64_t A, int64_t R,
                  int64_t B, int device, cudaStream_t stream);

}  // namespace strata::ops::cuda
