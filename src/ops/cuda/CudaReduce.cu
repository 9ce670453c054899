// CUDA launchers and registration: sum and max over [A, R, B].
#include "kernels/Reduce.cuh"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

// Columns per thread: a 16-byte pack when every row start is aligned.
template <class T>
int packWidth(const T* in, int64_t B) {
  constexpr int W = kernels::kVec<T>;
  return B % W == 0 && aligned16(in) ? W : 1;
}

template <class Op, class T, class U>
void launchOnePass(const T* in, U* out, int64_t A, int64_t R, int64_t B, int64_t splits,
                   cudaStream_t stream) {
  int64_t chunk = (R + splits - 1) / splits;
  if (B == 1) {
    int threads = int(std::clamp<int64_t>((chunk + 31) / 32 * 32, 32, 512));
    kernels::reduceRowsKernel<Op, T, U>
        <<<dim3(unsigned(A), unsigned(splits)), threads, 0, stream>>>(in, out, R, chunk);
  } else if (int V = packWidth<T>(in, B); V > 1) {
    constexpr int W = kernels::kVec<T>;
    dim3 grid(unsigned((B + 32 * W - 1) / (32 * W)), unsigned(A), unsigned(splits));
    kernels::reduceColumnsKernel<Op, T, U, W><<<grid, dim3(32, 8), 0, stream>>>(in, out, R, B, chunk);
  } else {
    dim3 grid(unsigned((B + 31) / 32), unsigned(A), unsigned(splits));
    kernels::reduceColumnsKernel<Op, T, U, 1><<<grid, dim3(32, 8), 0, stream>>>(in, out, R, B, chunk);
  }
  STRATA_CUDA_CHECK_LAUNCH();
}

template <class Op, class T, class U>
void launchTyped(const T* in, U* out, int64_t A, int64_t R, int64_t B, int device, cudaStream_t stream) {
  STRATA_CHECK(A < 65536 || B == 1, "reduce: {} outer rows exceed the grid limit", A);
  STRATA_CHECK(A < (int64_t(1) << 31), "reduce: too many rows ({})", A);
  // Enough blocks to fill the GPU: split R when the outer dims alone give too few.
  int64_t columnsPerBlock = 32 * int64_t(packWidth<T>(in, B));
  int64_t blocks = B == 1 ? A : A * ((B + columnsPerBlock - 1) / columnsPerBlock);
  int64_t target = 8 * smCount(device);
  int64_t splits = 1;
  if (blocks < target) splits = std::min<int64_t>((target + blocks - 1) / blocks, (R + 1023) / 1024);
  splits = std::clamp<int64_t>(splits, 1, 65535);
  if (splits == 1) {
    launchOnePass<Op, T, U>(in, out, A, R, B, 1, stream);
    return;
  }
  Tensor partial = Tensor::empty({A, splits, B}, DType::F32, Device::cuda(device));
  launchOnePass<Op, T, float>(in, static_cast<float*>(partial.data()), A, R, B, splits, stream);
  launchOnePass<Op, float, U>(static_cast<const float*>(partial.data()), out, A, splits, B, 1, stream);
}

template <class Op>
void launchReduceOp(const void* in, DType inType, void* out, DType outType, int64_t A, int64_t R, int64_t B,
                    int device, cudaStream_t stream) {
  visitFloatingCuda(inType, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (outType == inType) {
      launchTyped<Op, T, T>(static_cast<const T*>(in), static_cast<T*>(out), A, R, B, device, stream);
    } else {
      STRATA_CHECK(outType == DType::F32, "reduce: output dtype {} must be {} or f32", outType, inType);
      launchTyped<Op, T, float>(static_cast<const T*>(in), static_cast<float*>(out), A, R, B, device, stream);
    }
  });
}

template <int OpId>
void reduce(const Tensor& in, const Tensor& out, int64_t A, int64_t R, int64_t B) {
  DeviceGuard guard(in.device().index);
  launchReduce(OpId, in.data(), in.dtype(), out.data(), out.dtype(), A, R, B, in.device().index,
               streamOf(in));
}

}  // namespace

void launchReduce(int op, const void* in, DType inType, void* out, DType outType, int64_t A, int64_t R,
                  int64_t B, int device, cudaStream_t stream) {
  if (op == 0)
    launchReduceOp<kernels::SumReduce>(in, inType, out, outType, A, R, B, device, stream);
  else
    launchReduceOp<kernels::MaxReduce>(in, inType, out, outType, A, R, B, device, stream);
}

void registerReduce(Registry& r) {
  r.add<ReduceKernel>("sum", DeviceType::CUDA, &reduce<0>);
  r.add<ReduceKernel>("amax", DeviceType::CUDA, &reduce<1>);
}

}  // namespace strata::ops::cuda
