// FP8 launchers: the cast with its amax (and its fused prologue and column sums) and delayed scaling's update
// (kernels/Fp8.cuh). The FP8 GEMM is CudaGemm.cu's, through GemmArgs' FP8 operands.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/Fp8.cuh"
#include "src/ops/ElementwiseFunctors.h"
#include "src/ops/cuda/CudaCommon.h"

namespace strata::ops::cuda {
namespace {

// The prologues of a wide cast (kernels::Fp8AsIs's form): the element's GELU, or its GELU's backward with
// aux the GELU's input, computed as the elementwise kernels compute them and rounded to T as they store them.
template <class T>
struct Fp8Gelu {
  static constexpr bool kAux = false;
  fn::GeluTanh f;  // made on the host, as the elementwise kernels' functors are
  __device__ __forceinline__ float operator()(float x, float) const {
    return kernels::toAcc(kernels::fromAcc<T>(f(x)));
  }
};
template <class T>
struct Fp8GeluBackward {
  static constexpr bool kAux = true;
  fn::GeluTanhBackward f;
  __device__ __forceinline__ float operator()(float g, float pre) const {
    return kernels::toAcc(kernels::fromAcc<T>(f(g, pre)));
  }
};

template <class T, class P>
void launchWide(const Tensor& x, const Tensor& aux, P prologue, Fp8Format format, const Tensor& scale,
                const Tensor& amax, uint8_t* p, uint8_t* t, float* partials, cudaStream_t stream) {
  int64_t rows = x.size(0), cols = x.size(1);
  int64_t tiles = ((rows + kernels::kFp8WideTile - 1) / kernels::kFp8WideTile) *
                  ((cols + kernels::kFp8WideTile - 1) / kernels::kFp8WideTile);
  unsigned blocks = unsigned(std::min<int64_t>(tiles, 8 * int64_t(smCount(x.device().index))));
  auto* in = static_cast<const T*>(x.data());
  auto* a = aux.defined() ? static_cast<const T*>(aux.data()) : nullptr;
  auto* sc = static_cast<const float*>(scale.data());
  auto* am = static_cast<float*>(amax.data());
  if (format == Fp8Format::E4M3)
    kernels::fp8CastWideKernel<T, Fp8Format::E4M3, P>
        <<<blocks, 256, 0, stream>>>(in, a, rows, cols, prologue, sc, am, p, t, partials);
  else
    kernels::fp8CastWideKernel<T, Fp8Format::E5M2, P>
        <<<blocks, 256, 0, stream>>>(in, a, rows, cols, prologue, sc, am, p, t, partials);
  STRATA_CUDA_CHECK_LAUNCH();
}

bool fp8Cast(const Tensor& x, Fp8Prologue prologue, const Tensor& aux, Fp8Format format, const Tensor& scale,
             const Tensor& amax, const Tensor& plain, const Tensor& transposed, const Tensor& columnSums) {
  DeviceGuard guard(x.device().index);
  int64_t rows = x.size(0), cols = x.size(1);
  auto* p = plain.defined() ? static_cast<uint8_t*>(plain.data()) : nullptr;
  auto* t = transposed.defined() ? static_cast<uint8_t*>(transposed.data()) : nullptr;
  cudaStream_t stream = streamOf(x);
  // The wide kernel's 8-element packs: whole 16-byte loads and 8-byte stores on every row.
  bool wide = rows % 8 == 0 && cols % 8 == 0 && aligned16(x.data()) &&
              (!aux.defined() || aligned16(aux.data())) && (cols * int64_t(dtypeSize(x.dtype()))) % 16 == 0 &&
              (!p || reinterpret_cast<uintptr_t>(p) % 8 == 0) &&
              (!t || reinterpret_cast<uintptr_t>(t) % 8 == 0);
  if (wide) {
    int64_t tileRows = (rows + kernels::kFp8WideTile - 1) / kernels::kFp8WideTile;
    Tensor partials =
        columnSums.defined() ? Tensor::empty({tileRows, cols}, DType::F32, x.device()) : Tensor();
    float* part = partials.defined() ? static_cast<float*>(partials.data()) : nullptr;
    visitFloatingCuda(x.dtype(), "fp8Cast", [&](auto tag) {
      using T = typename decltype(tag)::type;
      ScalarArgs none{};
      if (prologue == Fp8Prologue::GeluTanh)
        launchWide<T>(x, aux, Fp8Gelu<T>{fn::GeluTanh(none)}, format, scale, amax, p, t, part, stream);
      else if (prologue == Fp8Prologue::GeluTanhBackward)
        launchWide<T>(x, aux, Fp8GeluBackward<T>{fn::GeluTanhBackward(none)}, format, scale, amax, p, t, part,
                      stream);
      else
        launchWide<T>(x, aux, kernels::Fp8AsIs{}, format, scale, amax, p, t, part, stream);
    });
    if (part) {
      kernels::fp8ColumnSumsKernel<<<unsigned((cols + 255) / 256), 256, 0, stream>>>(
          part, tileRows, cols, static_cast<float*>(columnSums.data()));
      STRATA_CUDA_CHECK_LAUNCH();
    }
    return true;
  }
  // ops::fp8CastFused composes what this kernel does not fuse.
  if (prologue != Fp8Prologue::None || columnSums.defined()) return false;
  int64_t tilesX = (cols + kernels::kFp8Tile - 1) / kernels::kFp8Tile;
  int64_t tilesY = (rows + kernels::kFp8Tile - 1) / kernels::kFp8Tile;
  STRATA_CHECK(tilesX < (int64_t(1) << 31), "fp8Cast: {} columns are too many", cols);
  dim3 grid(unsigned(tilesX), unsigned(std::min<int64_t>(tilesY, 65535)));
  visitFloatingCuda(x.dtype(), "fp8Cast", [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::fp8CastKernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(x.data()), rows, cols, format,
                                                        static_cast<const float*>(scale.data()),
                                                        static_cast<float*>(amax.data()), p, t);
  });
  STRATA_CUDA_CHECK_LAUNCH();
  return true;
}

void fp8UpdateScales(const std::vector<Tensor>& states, int64_t history, int64_t position, int margin,
                     bool mostRecent) {
  Device dev = states[0].device();
  DeviceGuard guard(dev.index);
  std::vector<float*> pointers;
  for (const Tensor& s : states) pointers.push_back(static_cast<float*>(s.data()));
  STRATA_CHECK(pointers.size() < 65536, "fp8UpdateScales: {} states are too many for one launch",
               pointers.size());
  // The pointers travel in one small copy on the compute stream, ordered before the kernel that reads them;
  // `pointers` is pageable, so the copy has read it when cudaMemcpyAsync returns.
  size_t bytes = pointers.size() * sizeof(float*);
  Tensor table = Tensor::empty({int64_t(bytes)}, DType::U8, dev);
  cudaStream_t stream = streamOf(table);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(table.data(), pointers.data(), bytes, cudaMemcpyHostToDevice, stream));
  kernels::fp8UpdateScalesKernel<<<dim3(unsigned(pointers.size()), 3), 256, 0, stream>>>(
      static_cast<float* const*>(table.data()), history, position, margin, mostRecent);
  STRATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void registerFp8(Registry& r) {
  r.add<Fp8CastKernel>("fp8Cast", DeviceType::CUDA, &fp8Cast);
  r.add<Fp8UpdateScalesKernel>("fp8UpdateScales", DeviceType::CUDA, &fp8UpdateScales);
}

}  // namespace strata::ops::cuda
